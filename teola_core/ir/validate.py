"""Graph validation: every error names the graph, the node and the port.

Checked: edges point at existing nodes and ports; every required input port has exactly
one producer and no port has two; port types are compatible; guards come from
conditions; the graph is acyclic with exactly one output; each kind has the config it
needs (an engine for engine primitives, a template for format, ...); a speculative node
runs on an engine and feeds its named consumer by exactly one edge, with an output for
each of its ports when withdrawn.
"""

from __future__ import annotations

from collections import Counter

from teola_core.ir.errors import GraphError
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import Placement, PrimitiveKind, spec_of
from teola_core.ir.node import Node
from teola_core.ir.speculation import speculation_of
from teola_core.ir.types import compatible

_REQUIRED_CONFIG = {
    PrimitiveKind.FORMAT: "template",
    PrimitiveKind.CALL: "fn",
    PrimitiveKind.CONDITION: "predicate",
    PrimitiveKind.AGGREGATE: "mode",
    PrimitiveKind.INPUT: "name",
}


def validate(graph: Graph) -> Graph:
    """Return the graph if it is well formed; raise `GraphError` naming the problem."""
    where = f"graph {graph.name!r}"
    for e in graph.data_edges:
        for end, port, side in ((e.src, e.src_port, "output"), (e.dst, e.dst_port, "input")):
            node = graph.nodes.get(end)
            if node is None:
                raise GraphError(
                    f"{where}: edge {e.src}.{e.src_port} -> {e.dst}.{e.dst_port} names unknown node {end!r}"
                )
            found = node.output_port(port) if side == "output" else node.input_port(port)
            if found is None:
                raise GraphError(f"{where}: node {node.describe()} has no {side} port {port!r}")
        produced = graph.nodes[e.src].output_port(e.src_port)
        consumed = graph.nodes[e.dst].input_port(e.dst_port)
        assert produced is not None and consumed is not None
        if not compatible(produced.type, consumed.type):
            raise GraphError(
                f"{where}: type mismatch on {e.dst}.{e.dst_port}: it takes {consumed.type.value} "
                f"but {e.src}.{e.src_port} produces {produced.type.value}"
            )
    for c in graph.control_edges:
        for end in (c.src, c.dst):
            if end not in graph.nodes:
                raise GraphError(f"{where}: control edge {c.src} -> {c.dst} names unknown node {end!r}")
        if c.branch is not None and graph.nodes[c.src].kind != PrimitiveKind.CONDITION:
            raise GraphError(f"{where}: node {c.dst!r} is guarded by {c.src!r}, which is not a condition")

    for node_id, node in graph.nodes.items():
        counts = Counter(e.dst_port for e in graph.data_in(node_id))
        for port in node.inputs:
            n = counts.get(port.name, 0)
            if n > 1:
                raise GraphError(f"{where}: input port {node_id}.{port.name} has {n} producers; it takes one")
            if n == 0 and not port.optional:
                raise GraphError(f"{where}: input port {node_id}.{port.name} has no producer ({node.describe()})")
        spec = spec_of(node.kind)
        if spec.placement == Placement.ENGINE and not node.engine:
            raise GraphError(f"{where}: {node.kind.value} node {node_id!r} names no engine")
        needed = _REQUIRED_CONFIG.get(node.kind)
        if needed and needed not in node.config:
            raise GraphError(f"{where}: {node.kind.value} node {node_id!r} has no {needed!r} in its config")
        if (node.kind == PrimitiveKind.PARTIAL_DECODE) != (node.part is not None):
            has = "has a decode part" if node.part is not None else "has no decode part (DecodePart)"
            raise GraphError(f"{where}: {node.kind.value} node {node_id!r} {has}")
        if node.kind == PrimitiveKind.FORMAT:
            template = node.config["template"]
            if node.config.get("prefix_segments") is not None:  # a prefix format (prefill split)
                template = template.prefix(node.config["prefix_segments"])
            template_vars = set(template.variables)
            ports = {p.name for p in node.inputs}
            if template_vars != ports:
                raise GraphError(
                    f"{where}: format node {node_id!r} has ports {sorted(ports)} "
                    f"but its template uses {sorted(template_vars)}"
                )

        _check_speculation(graph, node, where)

    graph.output_node  # noqa: B018 - raises unless exactly one output node
    graph.topological_order  # noqa: B018 - raises on a cycle, naming it
    return graph


def _check_speculation(graph: Graph, node: Node, where: str) -> None:
    speculation = speculation_of(node)
    if speculation is None:
        return
    name = f"{where}: speculative node {node.id!r}"
    if spec_of(node.kind).placement != Placement.ENGINE:
        raise GraphError(f"{name} is a {node.kind.value}: only engine work can wait for idle engine time")
    edges = [e for e in graph.data_out(node.id) if e.dst == speculation.consumer]
    if len(edges) != 1 or any(c.dst == speculation.consumer for c in graph.control_out(node.id)):
        raise GraphError(
            f"{name} must feed its consumer {speculation.consumer!r} by exactly one data edge (found {len(edges)})"
        )
    missing = sorted({p.name for p in node.outputs} - set(speculation.withdrawn))
    if missing:
        raise GraphError(f"{name} has no withdrawn value for output port(s) {missing}")
