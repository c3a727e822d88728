"""`TeolaRunnable.explain()`'s text: how calls run, what Teola expects to gain and what blocks
more (`plan_report.py`), the engines and steps, and every graph (`teola_core.explain`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from teola_core.engines.protocol import EngineSet
from teola_core.explain import graph_sections, section
from teola_langchain.planning.plan_report import measured, report, seconds
from teola_langchain.planning.plans import Plan


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
    not_learning: str | None,
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
    if plan.traced.early:
        pruned = "\n".join(f"- {note}" for note in plan.traced.early)
        out.append(section("dependency pruning (which sequence steps start before the step ahead ends)", pruned))
    advice = report(first, plan, engines, calls, calls_on_graph, learn_after, not_learning)
    out.extend(section(title, body) for title, body in advice)
    engine_lines = [
        f"- {name}: {type(e).__name__}" + (f" ({where[name]})" if name in where else "")
        for name, e in engines.engines.items()
    ]
    out.append(section("engines (profiles are keyed by these names)", "\n".join(engine_lines) or "- none"))
    out.append(section("steps (profiles are keyed by these names, or a step's own name)", _steps_text(plan)))
    for sub in plan.traced.graphs():
        out.extend(graph_sections(sub.name, sub.pgraph, sub.passes, sub.graph, png_dir))
    return "\n".join(out)


def _steps_text(plan: Plan) -> str:
    lines = []
    for key, info in plan.traced.steps.items():
        timed = measured(plan.profiles, key)
        learned = key not in plan.given
        how = f"{seconds(timed)} ({'learned' if learned else 'given'})" if timed is not None else "no time yet"
        count = plan.counts.get(key)
        items = f", writes {count} items" if count is not None else ""
        runs_as = f", runs as {info.runs_as}" if info.runs_as else ""
        lines.append(f"- {key}: {info.what}{runs_as}, {how}{items}")
    return "\n".join(lines) or "- none"
