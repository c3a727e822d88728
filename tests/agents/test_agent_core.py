"""The agent runtime's parts: TTL rule, tool cache, programs, priority, compaction."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from engine_watch import queued
from toy_engines import ToyLLM

from teola_core.agents import AgentFeatures, AgentRuntime, ToolDurations, ToolResultCache, canonical_args, continuum_ttl
from teola_core.agents.tool_cache import ToolCacheStats
from teola_core.agents.ttl import prior_ttl
from teola_core.engines.protocol import Call, CallResult, EngineLimits, EngineSet
from teola_core.engines.retention import KVRetention
from teola_core.ir.builder import GraphBuilder
from teola_core.ir.types import KVHandle, PortType


# -- the time-to-live rule ---------------------------------------------------------------
def test_continuum_ttl_picks_the_best_observed_duration() -> None:
    # gains: 0.1 -> 1/3*1 - 0.1 = 0.23; 0.2 -> 2/3 - 0.2 = 0.47; 5.0 -> 1 - 5 < 0
    assert continuum_ttl([5.0, 0.1, 0.2], benefit_s=1.0) == 0.2
    assert continuum_ttl([5.0, 0.1, 0.2], benefit_s=20.0) == 5.0  # 15 > 2/3*20 - 0.2: wait for the slow one
    assert continuum_ttl([0.1, 0.2], benefit_s=0.0) == 0.0
    assert continuum_ttl([], benefit_s=3.0) == 0.0


def test_tool_durations_use_own_samples_only_past_the_threshold() -> None:
    durations = ToolDurations(min_samples=3)
    for _ in range(3):
        durations.observe("slow", 9.0)
    durations.observe("fast", 0.1)
    assert durations.samples("fast") == [0.1, 9.0, 9.0, 9.0]  # too few of its own: everyone's
    assert durations.samples("slow") == [0.1, 9.0, 9.0, 9.0]
    durations.observe("slow", 9.0)
    assert durations.samples("slow") == [9.0] * 4
    assert durations.ttl("slow", reload_s=20.0, queue_s=0.0) == 9.0
    assert durations.ttl("slow", reload_s=1.0, queue_s=0.0) == 0.0


def test_without_observations_the_exponential_prior_decides() -> None:
    durations = ToolDurations()
    assert durations.ttl("new", reload_s=0.0, queue_s=0.0) == 0.0
    long_hold = durations.ttl("new", reload_s=10.0, queue_s=0.0)
    assert long_hold == prior_ttl(10.0) and long_hold > 1.0
    with pytest.raises(ValueError, match="negative"):
        durations.observe("new", -1.0)


# -- the tool cache --------------------------------------------------------------------------
def test_canonical_args_ignore_key_order_and_reject_non_json() -> None:
    assert canonical_args({"b": 2, "a": [1]}) == canonical_args({"a": [1], "b": 2}) == '{"a":[1],"b":2}'
    with pytest.raises(TypeError, match="JSON"):
        canonical_args({"a": object()})


class JoinedStats(ToolCacheStats):
    """The cache's stats, with an event set when a caller first merges into a call in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.joined = asyncio.Event()

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "merged" and value:
            self.joined.set()


def watched_cache() -> tuple[ToolResultCache, JoinedStats]:
    cache = ToolResultCache()
    cache.stats = stats = JoinedStats()
    return cache, stats


async def test_identical_calls_in_flight_run_the_tool_once() -> None:
    cache, stats = watched_cache()
    gate = asyncio.Event()
    runs = 0

    async def read() -> str:
        nonlocal runs
        runs += 1
        await gate.wait()
        return "contents"

    first = asyncio.ensure_future(cache.get_or_run("read", {"p": "a", "q": 1}, "v1", read))
    second = asyncio.ensure_future(cache.get_or_run("read", {"q": 1, "p": "a"}, "v1", read))
    await stats.joined.wait()  # the second call waits on the first, still in flight
    gate.set()
    assert await asyncio.gather(first, second) == ["contents", "contents"]
    assert await cache.get_or_run("read", {"p": "a", "q": 1}, "v1", read) == "contents"
    assert runs == 1 and (cache.stats.runs, cache.stats.merged, cache.stats.hits) == (1, 1, 1)
    await cache.get_or_run("read", {"p": "a", "q": 1}, "v2", read)  # another version runs again
    assert runs == 2


async def test_failures_reach_every_waiter_and_are_not_kept() -> None:
    cache, stats = watched_cache()
    attempts = 0

    async def flaky() -> str:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            await stats.joined.wait()  # fails once the second caller waits on this call
            raise OSError("disk gone")
        return "ok"

    results = await asyncio.gather(
        cache.get_or_run("read", {}, "", flaky), cache.get_or_run("read", {}, "", flaky), return_exceptions=True
    )
    assert all(isinstance(r, OSError) for r in results)
    assert await cache.get_or_run("read", {}, "", flaky) == "ok"
    assert attempts == 2


async def test_a_cancelled_runner_does_not_cancel_merged_waiters() -> None:
    cache, stats = watched_cache()
    gate = asyncio.Event()
    entered = [asyncio.Event(), asyncio.Event()]  # the tool's first and second run began

    async def slow() -> str:
        entered[cache.stats.runs - 1].set()
        await gate.wait()
        return "done"

    runner = asyncio.ensure_future(cache.get_or_run("t", {}, "", slow))
    await entered[0].wait()  # the runner's call is in flight
    waiter = asyncio.ensure_future(cache.get_or_run("t", {}, "", slow))
    await stats.joined.wait()  # the waiter awaits it
    runner.cancel()
    await entered[1].wait()  # the runner went away: the waiter runs the tool itself
    gate.set()
    assert await waiter == "done"
    assert runner.cancelled()
    assert (cache.stats.runs, cache.stats.merged) == (2, 1)


# -- programs on a runtime -------------------------------------------------------------------
class RetainingLLM(ToyLLM, KVRetention):
    """The toy LLM plus a record of holds (what an engine with retention is asked)."""

    def __init__(self, name: str = "llm", capacity: int = 10) -> None:
        super().__init__(name)
        self.holds: dict[str, tuple[str, float]] = {}
        self.log: list[tuple[str, str]] = []
        self.capacity = capacity

    def retain(self, program: str, text: str, ttl_s: float) -> bool:
        if ttl_s <= 0 or len(self.holds) >= self.capacity:
            return False
        self.holds[program] = (text, ttl_s)
        self.log.append(("retain", program))
        return True

    def release(self, program: str) -> None:
        if self.holds.pop(program, None) is not None:
            self.log.append(("release", program))

    def held_programs(self) -> frozenset[str]:
        return frozenset(self.holds)

    def reload_seconds(self, text: str) -> float | None:
        return 1.0 * len(text.split())  # slow enough that holding pays under the prior


async def test_a_program_runs_model_and_tool_calls_and_holds_kv_meanwhile() -> None:
    llm = RetainingLLM()
    agents = AgentRuntime(EngineSet().add(llm))
    program = agents.program("a")
    first = await program.generate("task: add", engine="llm", max_tokens=8)
    assert first == (await llm.run([_decode_of("task: add")]))[0]["text"]  # the toy model's own answer

    seen: list[str] = []

    async def tool() -> str:
        seen.append(str(llm.held_programs()))
        return " result"

    assert await program.call_tool("calc", {"x": 1}, tool) == " result"
    assert seen == ["frozenset({'a'})"]  # held while the tool ran (prior TTL > 0)
    assert llm.holds == {} or llm.holds["a"][0] == "task: add" + first
    await program.generate("task: add" + first + " result", engine="llm", max_tokens=8)
    assert llm.log == [("retain", "a"), ("release", "a")]
    assert [s.kind for s in program.steps] == ["model", "tool", "model"]
    grown = program.graph()
    assert sum(n.kind.value == "decode" for n in grown.nodes.values()) == 2
    assert len(grown.topological_order) == len(grown.nodes)
    program.finish()
    with pytest.raises(RuntimeError, match="finished"):
        await program.generate("x", engine="llm", max_tokens=1)
    await agents.close()


async def test_features_off_means_no_holds_and_no_cache() -> None:
    llm = RetainingLLM()
    agents = AgentRuntime(EngineSet().add(llm), features=AgentFeatures.none())
    program = agents.program()
    await program.generate("p", engine="llm", max_tokens=4)
    runs = 0

    async def tool() -> int:
        nonlocal runs
        runs += 1
        return runs

    assert [await program.call_tool("t", {}, tool, idempotent=True) for _ in range(2)] == [1, 2]
    assert llm.log == []
    program.finish()
    await agents.close()


async def test_idempotent_tools_are_shared_across_programs() -> None:
    agents = AgentRuntime(EngineSet().add(RetainingLLM()))
    a, b = agents.program("a"), agents.program("b")
    runs = 0

    async def read() -> str:
        nonlocal runs
        runs += 1
        return "doc"

    assert await a.call_tool("read", {"path": "x"}, read, idempotent=True) == "doc"
    assert await b.call_tool("read", {"path": "x"}, read, idempotent=True) == "doc"
    assert await b.call_tool("write", {"path": "x"}, read) == "doc"  # not idempotent: runs
    assert runs == 2 and b.stats.tool_cache_hits == 1
    await agents.close()


def test_unknown_feature_and_rule_are_named() -> None:
    with pytest.raises(ValueError, match="kv_cache"):
        AgentFeatures.only("kv_cache")
    with pytest.raises(ValueError, match="lifo"):
        AgentRuntime(EngineSet(), priority_rule="lifo")  # type: ignore[arg-type]


# -- priority -----------------------------------------------------------------------------------
class OneAtATimeLLM(ToyLLM):
    """Runs one call at a time and records the order the scheduler sent them in."""

    limits = EngineLimits(max_batch_items=1, concurrency=1)

    def __init__(self) -> None:
        super().__init__("llm")
        self.order: list[str] = []
        self.began = asyncio.Event()  # a call is running (and holds the only slot until `gate`)
        self.gate = asyncio.Event()

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        self.order.extend(c.query_id for c in calls if c.node.kind.value == "prefill")
        self.began.set()
        await self.gate.wait()
        return await super().run(calls)


@pytest.mark.parametrize("priority", [True, False])
async def test_a_returning_agent_goes_before_agents_that_came_later(priority: bool) -> None:
    llm = OneAtATimeLLM()
    now = [0.0]
    agents = AgentRuntime(EngineSet().add(llm), features=AgentFeatures(priority=priority), clock=lambda: now[0])
    early = agents.program("early")  # started at 0
    now[0] = 1.0
    late, blocker = agents.program("late"), agents.program("blocker")
    busy = asyncio.ensure_future(blocker.generate("b", engine="llm", max_tokens=1))
    await llm.began.wait()  # the blocker's prefill holds the only slot
    now[0] = 2.0
    late_queued = queued(agents.runtime, "llm", 1)
    late_call = asyncio.ensure_future(late.generate("l", engine="llm", max_tokens=1))
    await late_queued.wait()  # late's prefill waits behind the blocker
    now[0] = 3.0
    both_queued = queued(agents.runtime, "llm", 2)
    early_call = asyncio.ensure_future(early.generate("e", engine="llm", max_tokens=1))
    await both_queued.wait()  # early's too, issued after late's
    llm.gate.set()
    await asyncio.gather(busy, late_call, early_call)
    prefills = [q.split("/")[0] for q in llm.order]
    assert prefills == (["blocker", "early", "late"] if priority else ["blocker", "late", "early"])
    await agents.close()


# -- compaction ---------------------------------------------------------------------------------
async def test_compaction_ahead_is_used_only_for_the_same_input() -> None:
    agents = AgentRuntime(EngineSet().add(RetainingLLM()))
    program = agents.program()
    calls: list[str] = []

    def summarizer(label: str, *, done: asyncio.Event | None = None, gate: asyncio.Event | None = None) -> Any:
        async def summarize() -> str:
            calls.append(label)
            if gate is not None:
                await gate.wait()
            if done is not None:
                done.set()
            return f"summary by {label}"

        return summarize

    finished = asyncio.Event()
    program.compact_ahead("history-1", summarizer("ahead", done=finished))
    await finished.wait()  # done while the agent waited on its tool
    assert await program.compacted("history-1", summarizer("on path")) == "summary by ahead"
    finished = asyncio.Event()
    program.compact_ahead("history-2", summarizer("ahead", done=finished))
    await finished.wait()
    assert await program.compacted("history-3", summarizer("on path")) == "summary by on path"
    assert (program.stats.compactions_ahead, program.stats.compactions_on_path) == (1, 1)
    gate = asyncio.Event()
    program.compact_ahead("history-4", summarizer("still running", gate=gate))
    asyncio.get_running_loop().call_soon(gate.set)  # it cannot end before `compacted` waits for it
    assert await program.compacted("history-4", summarizer("on path")) == "summary by still running"
    assert calls == ["ahead", "ahead", "on path", "still running"]
    assert (program.stats.compactions_ahead, program.stats.compactions_on_path) == (2, 1)
    await agents.close()


async def test_compaction_feature_off_always_compacts_on_path() -> None:
    agents = AgentRuntime(EngineSet().add(RetainingLLM()), features=AgentFeatures(compaction=False))
    program = agents.program()

    async def summarize() -> str:
        return "s"

    program.compact_ahead("h", summarize)
    assert await program.compacted("h", summarize) == "s"
    assert program.stats.compactions_on_path == 1
    await agents.close()


# -- helpers ------------------------------------------------------------------------------------
def _decode_of(prompt: str) -> Call:
    b = GraphBuilder("probe")
    out = b.llm(b.input("prompt", PortType.ANY), engine="llm", max_tokens=8)
    b.output(text=out.text)
    return Call("probe", b.build().nodes["llm.decode"], {"kv": KVHandle("llm", prompt)})
