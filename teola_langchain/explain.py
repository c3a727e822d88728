"""Human-readable plans: the p-graph, the passes applied, the e-graph, and Mermaid."""

from __future__ import annotations

import re

from teola_core.ir.graph import Graph
from teola_core.ir.kinds import PrimitiveKind

_SHAPES = {
    PrimitiveKind.INPUT: ("([", "])"),
    PrimitiveKind.OUTPUT: ("([", "])"),
    PrimitiveKind.CONDITION: ("{", "}"),
    PrimitiveKind.AGGREGATE: ("[[", "]]"),
    PrimitiveKind.CALL: ("[/", "/]"),
}


def mermaid(graph: Graph) -> str:
    """A Mermaid flowchart: data edges solid, order-only edges dotted, guards labelled."""
    ids = {node_id: f"n{i}" for i, node_id in enumerate(graph.nodes)}
    lines = ["flowchart TD"]
    for node_id, node in graph.nodes.items():
        left, right = _SHAPES.get(node.kind, ("[", "]"))
        engine = f" @{node.engine}" if node.engine else ""
        text = _escape(f"{node_id}<br/>{node.kind.value}{engine}")
        lines.append(f'    {ids[node_id]}{left}"{text}"{right}')
    for e in graph.data_edges:
        label = _escape(e.dst_port if e.src_port in ("value", e.dst_port) else f"{e.src_port}→{e.dst_port}")
        lines.append(f'    {ids[e.src]} -->|"{label}"| {ids[e.dst]}')
    for c in graph.control_edges:
        label = f'|"branch {c.branch}"|' if c.branch is not None else ""
        lines.append(f"    {ids[c.src]} -.-> {label}{ids[c.dst]}".replace("-.-> |", "-.->|"))
    return "\n".join(lines)


def _escape(text: str) -> str:
    return re.sub(r'["]', "'", text)


def section(title: str, body: str) -> str:
    return f"== {title} ==\n{body.rstrip()}\n"
