"""`explain()` for optimized agents (LangChain and LlamaIndex alike): what the agent runtime
does, the engines, what the runs so far did (their `ProgramStats` added up), the last run's
graph as it grew (text, Mermaid, PNG with `png_dir`); the drop-in kit adds what recent runs did.

    record = AgentRecord()            # record.add(program) as each run ends
    text = "\\n".join(agent_sections("my-agent", features, "fcfs", engines, record))
"""

from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path

from teola_core.agents.host import AgentFeatures
from teola_core.agents.program import Program, ProgramStats
from teola_core.engines.protocol import Engine, EngineSet
from teola_core.engines.retention import KVPool
from teola_core.explain import file_name, mermaid, section
from teola_core.ir.draw import draw_graph


class AgentRecord:
    """The runs of one optimized agent: how many ended, their stats added up, the last one."""

    def __init__(self) -> None:
        self.runs = 0
        self.totals = ProgramStats()
        self.last: Program | None = None

    def add(self, program: Program) -> None:
        self.runs += 1
        for f in fields(ProgramStats):
            setattr(self.totals, f.name, getattr(self.totals, f.name) + getattr(program.stats, f.name))
        self.last = program


def _engine_line(name: str, engine: Engine) -> str:
    """An engine, and the KV pool programs are admitted against where it reports one."""
    capacity = engine.kv_capacity_tokens() if isinstance(engine, KVPool) else None
    pool = f" (KV pool {capacity} tokens: programs admitted by KV working set)" if capacity else ""
    return "\n  - ".join([f"- {name}: {type(engine).__name__}{pool}", *engine.notes()])


def agent_sections(
    name: str,
    features: AgentFeatures,
    priority_rule: str,
    engines: EngineSet,
    record: AgentRecord,
    png_dir: str | Path | None = None,
) -> list[str]:
    """`explain()`'s sections for an agent (see the module docstring)."""
    on = [f.name for f in fields(AgentFeatures) if getattr(features, f.name)]
    runtime = (
        f"- features on: {', '.join(on) or 'none'}\n- model calls ordered by: {priority_rule} "
        "(fcfs: earlier runs first; plas: least model time first)"
    )
    out = [
        f"Teola plan for the agent {name!r}\n",
        section("agent runtime", runtime),
        section("engines", "\n".join(_engine_line(n, e) for n, e in engines.engines.items()) or "- none"),
        section(f"runs ({record.runs} ended)", "\n".join(f"- {k}: {v}" for k, v in asdict(record.totals).items())),
    ]
    if record.last is not None:
        graph = record.last.graph()
        out += [section("the last run's graph, as it grew", graph.summary()), section("mermaid", mermaid(graph))]
        if png_dir is not None:
            path = draw_graph(graph, Path(png_dir) / f"{file_name(name)}-last-run.png")
            out.append(section("picture", str(path)))
    return out
