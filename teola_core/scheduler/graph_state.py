"""The graph scheduler's records: what it knows of a graph, and of each query running it.

Kept apart from the transitions (`teola_core.scheduler.graph_scheduler`), which are the
only code that changes these records.

Per graph, once (`GraphPlan`, cached by graph): node indexes, in-edge counts, each node's
producers (for its inputs) and consumers (data edges: does a skip propagate along it;
control edges: the guard's branch), and which nodes wait on speculative ones.

State, per query (`QueryState`), over the node indexes of its graph's plan:

    state      node -> waiting | ready | running | done | skipped | failed | cancelled
    remaining  node -> in-edges (data and control) whose source has not settled yet
    skip       node -> some settled source decided that this node is skipped
    outputs    node -> its output values, once done
    in_flight  dispatched nodes not yet finished (ready or running)
    unsettled  nodes neither done nor skipped; the query is done when it reaches 0
    given_up   speculative nodes given up (withdrawn, or to settle unrun when unblocked)
    story      every transition (node, from, to, time, cause), for `InvalidTransition`
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from teola_core.ir.graph import Graph
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.node import ItemSlice, Node
from teola_core.ir.speculation import Speculation, speculation_of
from teola_core.scheduler.events import SchedulerError


class NodeState(StrEnum):
    WAITING = "waiting"
    READY = "ready"
    RUNNING = "running"
    DONE = "done"
    SKIPPED = "skipped"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Transition:
    """One line of a node's story."""

    node_id: str
    start: NodeState
    finish: NodeState
    now: float
    cause: str


class InvalidTransition(SchedulerError):
    """An event asked a node for a transition its state does not allow; carries its story."""

    def __init__(
        self, query_id: str, node_id: str, start: NodeState | None, finish: str, story: list[Transition]
    ) -> None:
        lines = "\n".join(f"  {t.now:.6f} {t.start} -> {t.finish} ({t.cause})" for t in story) or "  (no story)"
        where = f"in state {start}" if start is not None else "unknown to the query"
        super().__init__(f"query {query_id}: node {node_id!r} {where} cannot become {finish}; story:\n{lines}")
        self.query_id = query_id
        self.node_id = node_id
        self.start = start
        self.finish = finish
        self.story = story


# Roles a plan gives its nodes: completed by the scheduler itself, or dispatched.
ROLE_INPUT, ROLE_OUTPUT, ROLE_DISPATCHED = 0, 1, 2


@dataclass(frozen=True, slots=True)
class GraphPlan:
    """A graph's indexes, built once and shared by every query that runs the graph."""

    graph: Graph
    ids: tuple[str, ...]
    index: Mapping[str, int]
    nodes: tuple[Node, ...]
    roles: tuple[int, ...]
    in_count: tuple[int, ...]
    # per node: (producer index, producer port, own port, slice) for each data in-edge
    producers: tuple[tuple[tuple[int, str, str, ItemSlice | None], ...], ...]
    # per node: (consumer index, skipped-if-this-is-skipped) for each data out-edge
    data_out: tuple[tuple[tuple[int, bool], ...], ...]
    # per node: (dependent index, guard branch or None) for each control out-edge
    control_out: tuple[tuple[tuple[int, int | None], ...], ...]
    is_condition: tuple[bool, ...]
    roots: tuple[int, ...]
    speculations: tuple[Speculation | None, ...]
    # consumer index -> the speculative nodes whose give-up its wait decides
    speculative_inputs: Mapping[int, tuple[int, ...]]

    @classmethod
    def of(cls, graph: Graph) -> GraphPlan:
        ids = tuple(graph.nodes)
        index = {node_id: i for i, node_id in enumerate(ids)}
        nodes = tuple(graph.nodes[i] for i in ids)
        in_count = [0] * len(ids)
        producers: list[list[tuple[int, str, str, ItemSlice | None]]] = [[] for _ in ids]
        data_out: list[list[tuple[int, bool]]] = [[] for _ in ids]
        control_out: list[list[tuple[int, int | None]]] = [[] for _ in ids]
        for e in graph.data_edges:
            src, dst = index[e.src], index[e.dst]
            port = nodes[dst].input_port(e.dst_port)
            required = port is None or not port.optional
            producers[dst].append((src, e.src_port, e.dst_port, e.select))
            data_out[src].append((dst, required))
            in_count[dst] += 1
        for c in graph.control_edges:
            src, dst = index[c.src], index[c.dst]
            control_out[src].append((dst, c.branch))
            in_count[dst] += 1
        speculations = tuple(speculation_of(n) for n in nodes)
        speculative_inputs: dict[int, tuple[int, ...]] = {}
        for i, speculation in enumerate(speculations):
            if speculation is not None:
                consumer = index[speculation.consumer]
                speculative_inputs[consumer] = (*speculative_inputs.get(consumer, ()), i)
        roles = tuple(
            ROLE_INPUT
            if n.kind == PrimitiveKind.INPUT
            else ROLE_OUTPUT
            if n.kind == PrimitiveKind.OUTPUT
            else ROLE_DISPATCHED
            for n in nodes
        )
        return cls(
            graph=graph,
            ids=ids,
            index=index,
            nodes=nodes,
            roles=roles,
            in_count=tuple(in_count),
            producers=tuple(tuple(p) for p in producers),
            data_out=tuple(tuple(d) for d in data_out),
            control_out=tuple(tuple(c) for c in control_out),
            is_condition=tuple(n.kind == PrimitiveKind.CONDITION for n in nodes),
            roots=tuple(i for i, n in enumerate(in_count) if n == 0),
            speculations=speculations,
            speculative_inputs=speculative_inputs,
        )


class QueryState:
    """One query's mutable state (see the module docstring)."""

    __slots__ = (
        "arrival",
        "depths",
        "given_up",
        "in_flight",
        "inputs",
        "outputs",
        "plan",
        "query_id",
        "remaining",
        "result",
        "skip",
        "state",
        "story",
        "unsettled",
    )

    def __init__(
        self, query_id: str, plan: GraphPlan, inputs: Mapping[str, Any], depths: tuple[float, ...], arrival: float
    ) -> None:
        n = len(plan.ids)
        self.query_id = query_id
        self.plan = plan
        self.inputs = inputs
        self.depths = depths
        self.arrival = arrival
        self.state: list[NodeState] = [NodeState.WAITING] * n
        self.remaining: list[int] = list(plan.in_count)
        self.skip = bytearray(n)
        self.given_up = bytearray(n)
        self.outputs: list[Mapping[str, Any] | None] = [None] * n
        self.in_flight: dict[int, None] = {}  # ordered set
        self.unsettled = n
        self.result: dict[str, Any] = {}
        self.story: list[Transition] = []
