"""The base of the agent drop-ins (`teola_core.agents.dropin.AgentDropIn`): runtimes per loop,
hooks on each, the record of ended runs and `explain()`."""

from __future__ import annotations

import asyncio

import pytest
from toy_engines import ToyLLM

from teola_core.agents import AgentDropIn, AgentRuntime
from teola_core.runtime.base import PrimitiveSpan


class Spans:
    def __init__(self) -> None:
        self.spans: list[PrimitiveSpan] = []

    def on_span(self, span: PrimitiveSpan) -> None:
        self.spans.append(span)


def test_a_bad_priority_rule_is_named_at_once() -> None:
    with pytest.raises(ValueError, match="unknown priority rule 'lifo'"):
        AgentDropIn("a", None, "lifo")  # type: ignore[arg-type]


def test_runs_on_two_loops_reach_the_hooks_record_and_explain() -> None:
    drop_in = AgentDropIn("helper", None, "plas")
    drop_in.engines.add(ToyLLM("llm"))
    drop_in.place_engines(drop_in.engines)
    before = Spans()
    drop_in.add_hook(before)  # before any runtime exists
    runtimes: list[AgentRuntime] = []

    async def one_run() -> None:
        runtime = drop_in.runtime()
        assert drop_in.runtime() is runtime  # one per loop
        runtimes.append(runtime)
        program = runtime.program()
        await program.generate("p", engine="llm", max_tokens=4)
        program.finish()
        drop_in.record.add(program)
        await drop_in._close_current_runtime()

    asyncio.run(one_run())
    asyncio.run(one_run())
    assert runtimes[0] is not runtimes[1] and drop_in.agent_runtimes() == []  # closed ones are forgotten
    assert len(before.spans) == len(drop_in.recent.spans()) > 0  # both loops' runtimes had both hooks
    text = drop_in.explain()
    assert text.startswith("Teola plan for the agent 'helper'\n")
    assert "- model calls ordered by: plas" in text and "== runs (2 ended) ==" in text
    assert "- llm: ToyLLM" in text and "- 4 timed primitives" in text  # a prefill and a decode a run
