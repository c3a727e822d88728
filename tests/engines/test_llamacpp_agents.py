"""The agent benchmark on the llama.cpp engine: a tiny real run, and the engine's waiting decodes.

Greedy decoding on canonical chunks is bit-identical however the prompts are split,
held or recomputed, so the plain agent and Teola's agent runtime answer alike; with the
state cache bounded and fewer sequences than agents, Teola's KV holds save prefill work.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("llama_cpp")

from engine_testkit import node, run

from teola_adapters.llamacpp import LlamaCppEngine
from teola_benchmarks.agents.llamacpp import bench_agents_llamacpp
from teola_benchmarks.agents.trace import Shape
from teola_core.engines.protocol import Call
from teola_core.ir.kinds import PrimitiveKind

pytestmark = pytest.mark.llamacpp  # a native crash fails these tests by name (tests/conftest.py)

K = PrimitiveKind
TINY = Shape(  # seed 2: three jobs of three calls, no tool longer than 0.5 s once scaled
    system_tokens=60,
    task_tokens=20,
    answer_tokens=8,
    result_tokens=25,
    mean_turns=100,  # almost surely capped: every job makes max_turns model calls
    max_turns=3,
    compact_tokens=400,
    summary_tokens=16,
)


def test_decodes_waiting_for_a_sequence_start_when_the_last_running_one_ends() -> None:
    """Two decodes, one sequence, both done in the same step as the other's end: no new call wakes the engine."""
    engine = LlamaCppEngine(max_sequences=1, n_threads=1)

    async def main() -> list[str]:
        try:
            kvs = [
                (await engine.run_one(Call("q", node(K.PREFILL, engine.name), {"prompt": p})))["kv"]
                for p in ("Hello there.", "Good morning.")
            ]
            calls = [Call("q", node(K.DECODE, engine.name, max_tokens=4), {"kv": kv}) for kv in kvs]
            return [outputs["text"] for outputs in await engine.run(calls)]
        finally:
            await engine.close()

    texts = run(main(), timeout=60)
    assert len(texts) == 2 and all(texts)


def test_teola_answers_like_the_plain_agent_and_holds_kv_across_tool_calls() -> None:
    """Equal answers and prompts, and KV held across tool calls. How many prompt tokens that
    saves depends on real time (whether a hold outlives its tool and the queue behind it:
    1706 to 2090 evaluated tokens against plain's 1962 in repeated runs here), so that
    figure is the benchmark's (`teola bench --agents --engines local-real`), not a test's."""
    result = asyncio.run(
        asyncio.wait_for(bench_agents_llamacpp(concurrency=3, seed=2, shape=TINY, max_sequences=1), 120)
    )
    assert result.mismatches == {}
    payload = result.to_json()
    plain, teola = payload["systems"]["plain"], payload["systems"]["teola"]
    assert [len(o.answers) for o in result.systems["plain"].outputs] == [3, 3, 3]
    assert plain["prompt_tokens"] == teola["prompt_tokens"] > 0
    assert teola["kv_holds"] > 0 and plain["kv_holds"] == 0
    for stats in (plain, teola):
        assert stats["mean_s"] <= stats["p95_s"]
