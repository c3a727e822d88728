"""Human-readable plans (`TeolaRunnable.explain()`): how calls run, the p-graph, the passes applied,
the e-graph, and Mermaid; what Teola expects to gain and what blocks more is `plan_report.py`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from teola_core.engines.protocol import EngineSet
from teola_core.ir.draw import draw_graph
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import PrimitiveKind
from teola_langchain.plan_report import measured, report, seconds
from teola_langchain.plans import Plan

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


def explain_plan(
    heading: str,
    first: Plan,
    plan: Plan,
    engines: EngineSet,
    where: Mapping[str, str],
    *,
    calls: int,
    calls_on_graph: int,
    learn_after: int,
    png_dir: str | Path | None = None,
) -> str:
    """explain()'s text: `heading`, how calls run on `plan` (and what `first`, the plan made at
    optimize(), expected), the engines (`where` they run), the steps, and every graph.

    With `png_dir`, each e-graph is also drawn as a PNG there (matplotlib).
    """
    out = [f"{heading}\n"]
    if plan.on_graph:
        how = (
            "invoke/ainvoke/batch/abatch run on Teola's graph ("
            + ("; ".join(plan.why) or "execution='graph'")
            + "); streams run as LangChain streams the chain"
        )
    else:
        how = (
            "nothing here would run sooner on Teola's graph (no pass applies, no engine batches across "
            "queries): every call runs as LangChain runs it"
        )
    out.append(section("execution", how))
    advice = report(first, plan, engines, calls, calls_on_graph, learn_after)
    out.extend(section(title, body) for title, body in advice)
    engine_lines = [
        f"- {name}: {type(e).__name__}" + (f" ({where[name]})" if name in where else "")
        for name, e in engines.engines.items()
    ]
    out.append(section("engines (profiles are keyed by these names)", "\n".join(engine_lines) or "- none"))
    out.append(section("steps (profiles are keyed by these names, or a step's own name)", _steps_text(plan)))
    for sub in plan.traced.graphs():
        out.append(section(f"p-graph {sub.name}", sub.pgraph.summary()))
        out.append(section(f"passes applied to {sub.name}", "\n".join(f"- {p}" for p in sub.passes) or "- none"))
        out.append(section(f"e-graph {sub.name}", sub.graph.summary()))
        out.append(section(f"mermaid {sub.name}", mermaid(sub.graph)))
        if png_dir is not None:
            path = draw_graph(sub.graph, Path(png_dir) / f"{_file_name(sub.name)}-egraph.png")
            out.append(section(f"picture {sub.name}", str(path)))
    return "\n".join(out)


def _steps_text(plan: Plan) -> str:
    lines = []
    for key, info in plan.traced.steps.items():
        timed = measured(plan.profiles, key)
        learned = key not in plan.given
        how = f"{seconds(timed)} ({'learned' if learned else 'given'})" if timed is not None else "no time yet"
        count = plan.counts.get(key)
        items = f", writes {count} items" if count is not None else ""
        lines.append(f"- {key}: {info.what}, {how}{items}")
    return "\n".join(lines) or "- none"


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "graph"
