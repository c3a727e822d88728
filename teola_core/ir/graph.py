"""The primitive graph: p-graph before the passes, e-graph after.

`Graph` is immutable; `GraphEditor` is the mutable working copy a pass edits and
freezes into a new `Graph`. Both carry the same three things: nodes (in build order),
data edges and control edges.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter
from typing import TypeVar

import networkx as nx

from teola_core.ir.errors import GraphError
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.node import ControlEdge, DataEdge, Node

_Edge = TypeVar("_Edge", DataEdge, ControlEdge)


def _edges_by(edges: Iterable[_Edge], end: Callable[[_Edge], str]) -> dict[str, list[_Edge]]:
    """The edges grouped by the node id at one `end` (`src` or `dst`): a graph's lookup tables."""
    index: dict[str, list[_Edge]] = defaultdict(list)
    for e in edges:
        index[end(e)].append(e)
    return index


@dataclass(frozen=True, eq=False)
class Graph:
    nodes: Mapping[str, Node]
    data_edges: tuple[DataEdge, ...] = ()
    control_edges: tuple[ControlEdge, ...] = ()
    name: str = "graph"
    notes: tuple[str, ...] = field(default=())  # what the passes did, in order

    # -- indexes (computed once per immutable graph) --------------------------------
    @cached_property
    def _in_data(self) -> dict[str, list[DataEdge]]:
        return _edges_by(self.data_edges, attrgetter("dst"))

    @cached_property
    def _out_data(self) -> dict[str, list[DataEdge]]:
        return _edges_by(self.data_edges, attrgetter("src"))

    @cached_property
    def _in_control(self) -> dict[str, list[ControlEdge]]:
        return _edges_by(self.control_edges, attrgetter("dst"))

    @cached_property
    def _out_control(self) -> dict[str, list[ControlEdge]]:
        return _edges_by(self.control_edges, attrgetter("src"))

    def data_in(self, node_id: str) -> list[DataEdge]:
        return self._in_data.get(node_id, [])

    def data_out(self, node_id: str) -> list[DataEdge]:
        return self._out_data.get(node_id, [])

    def control_in(self, node_id: str) -> list[ControlEdge]:
        return self._in_control.get(node_id, [])

    def control_out(self, node_id: str) -> list[ControlEdge]:
        return self._out_control.get(node_id, [])

    def predecessors(self, node_id: str) -> set[str]:
        return {e.src for e in self.data_in(node_id)} | {e.src for e in self.control_in(node_id)}

    def successors(self, node_id: str) -> set[str]:
        return {e.dst for e in self.data_out(node_id)} | {e.dst for e in self.control_out(node_id)}

    # -- structure -------------------------------------------------------------------
    @cached_property
    def output_node(self) -> Node:
        outs = [n for n in self.nodes.values() if n.kind == PrimitiveKind.OUTPUT]
        if len(outs) != 1:
            raise GraphError(f"graph {self.name!r} has {len(outs)} output nodes; it needs exactly one")
        return outs[0]

    @cached_property
    def input_nodes(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes.values() if n.kind == PrimitiveKind.INPUT)

    def to_networkx(self) -> nx.MultiDiGraph:
        g = nx.MultiDiGraph()
        for node_id, node in self.nodes.items():
            g.add_node(node_id, kind=node.kind.value)
        for e in self.data_edges:
            g.add_edge(e.src, e.dst, kind="data", src_port=e.src_port, dst_port=e.dst_port)
        for c in self.control_edges:
            g.add_edge(c.src, c.dst, kind="control", branch=c.branch)
        return g

    @cached_property
    def topological_order(self) -> tuple[str, ...]:
        """Kahn's order, ties broken by build order (stable, so repeatable).

        Hand-written rather than networkx's because every validation after every pass
        runs it; networkx is used only to name a cycle when there is one.
        """
        position = {node_id: i for i, node_id in enumerate(self.nodes)}
        indegree = dict.fromkeys(self.nodes, 0)
        successors: dict[str, list[str]] = defaultdict(list)
        for src, dst in [(e.src, e.dst) for e in self.data_edges] + [(c.src, c.dst) for c in self.control_edges]:
            if src in indegree and dst in indegree:
                indegree[dst] += 1
                successors[src].append(dst)
        ready = [position[n] for n, d in indegree.items() if d == 0]
        heapq.heapify(ready)
        ids = list(self.nodes)
        order: list[str] = []
        while ready:
            node_id = ids[heapq.heappop(ready)]
            order.append(node_id)
            for dst in successors[node_id]:
                indegree[dst] -= 1
                if indegree[dst] == 0:
                    heapq.heappush(ready, position[dst])
        if len(order) < len(ids):
            cycle = nx.find_cycle(self.to_networkx())
            names = " -> ".join(str(u) for u, *_ in cycle)
            raise GraphError(f"graph {self.name!r} has a cycle: {names} -> {cycle[0][0]}")
        return tuple(order)

    def depths(self, cost: Callable[[Node], float] | None = None) -> dict[str, float]:
        """Longest path from each node to the output, counting the node itself.

        With `cost=None` every node counts 1 (path length in nodes); with a cost
        function (e.g. profiled latency) it is the critical path to the output.
        """
        weight = cost or (lambda _node: 1.0)
        depth: dict[str, float] = {}
        for node_id in reversed(self.topological_order):
            below = max((depth[s] for s in self.successors(node_id)), default=0.0)
            depth[node_id] = weight(self.nodes[node_id]) + below
        return depth

    def edit(self) -> GraphEditor:
        return GraphEditor(self)

    def same_as(self, other: Graph) -> bool:
        return (
            list(self.nodes) == list(other.nodes)
            and all(self.nodes[k].same_as(other.nodes[k]) for k in self.nodes)
            and set(self.data_edges) == set(other.data_edges)
            and set(self.control_edges) == set(other.control_edges)
        )

    def summary(self) -> str:
        """One line per node: id, kind, engine, inputs (producer.port)."""
        lines = [f"graph {self.name}: {len(self.nodes)} nodes"]
        for node_id in self.topological_order:
            node = self.nodes[node_id]
            srcs = ", ".join(
                f"{e.dst_port}<-{e.src}.{e.src_port}{f'[{e.select.start}:{e.select.stop}]' if e.select else ''}"
                for e in self.data_in(node_id)
            )
            ctrl = ", ".join(
                f"{c.src}" + (f"?{c.branch}" if c.branch is not None else "") for c in self.control_in(node_id)
            )
            engine = f" @{node.engine}" if node.engine else ""
            after = f" after {ctrl}" if ctrl else ""
            lines.append(f"  {node_id}: {node.kind.value}{engine} ({srcs}){after}")
        return "\n".join(lines)


class GraphEditor:
    """A mutable working copy of a graph, for passes and builders."""

    def __init__(self, graph: Graph | None = None, name: str = "graph") -> None:
        self.name = graph.name if graph else name
        self.nodes: dict[str, Node] = dict(graph.nodes) if graph else {}
        self.data_edges: list[DataEdge] = list(graph.data_edges) if graph else []
        self.control_edges: list[ControlEdge] = list(graph.control_edges) if graph else []
        self.notes: list[str] = list(graph.notes) if graph else []

    def add_node(self, node: Node) -> Node:
        if node.id in self.nodes:
            raise GraphError(f"node id {node.id!r} is already in graph {self.name!r}")
        self.nodes[node.id] = node
        return node

    def replace_node(self, node: Node) -> None:
        if node.id not in self.nodes:
            raise GraphError(f"no node {node.id!r} in graph {self.name!r} to replace")
        self.nodes[node.id] = node

    def remove_node(self, node_id: str) -> None:
        """Remove a node and every edge that touches it."""
        del self.nodes[node_id]
        self.data_edges = [e for e in self.data_edges if node_id not in (e.src, e.dst)]
        self.control_edges = [e for e in self.control_edges if node_id not in (e.src, e.dst)]

    def fresh_id(self, base: str) -> str:
        if base not in self.nodes:
            return base
        n = 1
        while f"{base}#{n}" in self.nodes:
            n += 1
        return f"{base}#{n}"

    def connect(self, edge: DataEdge | ControlEdge) -> None:
        target = self.data_edges if isinstance(edge, DataEdge) else self.control_edges
        if edge not in target:
            target.append(edge)  # type: ignore[arg-type]

    def disconnect(self, edge: DataEdge | ControlEdge) -> None:
        target = self.data_edges if isinstance(edge, DataEdge) else self.control_edges
        target.remove(edge)  # type: ignore[arg-type]

    def data_in(self, node_id: str) -> list[DataEdge]:
        return [e for e in self.data_edges if e.dst == node_id]

    def data_out(self, node_id: str) -> list[DataEdge]:
        return [e for e in self.data_edges if e.src == node_id]

    def control_in(self, node_id: str) -> list[ControlEdge]:
        return [e for e in self.control_edges if e.dst == node_id]

    def control_out(self, node_id: str) -> list[ControlEdge]:
        return [e for e in self.control_edges if e.src == node_id]

    def note(self, text: str) -> None:
        self.notes.append(text)

    def freeze(self) -> Graph:
        return Graph(
            nodes=dict(self.nodes),
            data_edges=tuple(self.data_edges),
            control_edges=tuple(self.control_edges),
            name=self.name,
            notes=tuple(self.notes),
        )


def merge_graphs(graphs: Iterable[Graph], name: str) -> Graph:
    """Disjoint union (ids must not collide); used to show many queries at once."""
    editor = GraphEditor(name=name)
    for g in graphs:
        for node in g.nodes.values():
            editor.add_node(node)
        editor.data_edges.extend(g.data_edges)
        editor.control_edges.extend(g.control_edges)
    return editor.freeze()
