"""Plans in words and pictures, alike for every adapter's `explain()`: titled sections,
each graph as text and Mermaid (and a PNG with `png_dir`), and what recent runs did on
each engine (and their timeline as a PNG).

    out = [section("engines", "- llm: ..."), *graph_sections("chain", pgraph, passes, egraph, png_dir)]
    out += timeline_sections(drop_in.recent.spans(), png_dir)
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from teola_core.ir.draw import draw_graph
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import PrimitiveKind
from teola_core.runtime.base import PrimitiveSpan
from teola_core.runtime.timeline import plot_timeline, row_of

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


def file_name(name: str) -> str:
    """`name` made safe as a file name."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "graph"


def graph_sections(
    name: str, pgraph: Graph, passes: Sequence[str], egraph: Graph, png_dir: str | Path | None = None
) -> list[str]:
    """The p-graph, the passes applied, the e-graph and its Mermaid (and PNG, with `png_dir`)."""
    out = [
        section(f"p-graph {name}", pgraph.summary()),
        section(f"passes applied to {name}", "\n".join(f"- {p}" for p in passes) or "- none"),
        section(f"e-graph {name}", egraph.summary()),
        section(f"mermaid {name}", mermaid(egraph)),
    ]
    if png_dir is not None:
        path = draw_graph(egraph, Path(png_dir) / f"{file_name(name)}-egraph.png")
        out.append(section(f"picture {name}", str(path)))
    return out


def timeline_sections(spans: Sequence[PrimitiveSpan], png_dir: str | Path | None = None) -> list[str]:
    """What recent runs did per engine and primitive kind (and their timeline PNG, with `png_dir`)."""
    timed = [s for s in spans if s.ended_at > s.started_at]
    if not timed:
        return [section("recent runs", "- none recorded yet (or every step ran inline)")]
    rows: defaultdict[str, list[PrimitiveSpan]] = defaultdict(list)
    for span in timed:
        rows[row_of(span)].append(span)
    queries = len({s.query_id.split("/")[0] for s in timed})
    lines = [f"- {len(timed)} timed primitives of {queries} queries"]
    for row, group in sorted(rows.items()):
        busy = sum(s.ended_at - s.started_at for s in group)
        waited = sum(s.started_at - s.ready_at for s in group) / len(group)
        batch = sum(s.batch_size for s in group) / len(group)
        lines.append(
            f"- {row}: {len(group)} runs, {busy:.3f} s busy, mean wait {waited * 1000:.1f} ms, mean batch {batch:.1f}"
        )
    out = [section("recent runs", "\n".join(lines))]
    if png_dir is not None:
        path = plot_timeline(timed, {}, Path(png_dir) / "timeline.png", "recent runs, by engine")
        out.append(section("timeline picture", str(path)))
    return out
