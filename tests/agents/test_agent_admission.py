"""Program admission by KV working set: a pure state machine, then through the runtime."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest
from engine_watch import running

from teola_adapters.simulated import SimLLM
from teola_adapters.simulated.paper_profiles import LLM
from teola_adapters.simulated.prefix_cache import BLOCK_TOKENS
from teola_core.agents import AgentFeatures, AgentRuntime
from teola_core.agents.admission import AdmissionRule, ProgramAdmission
from teola_core.engines.protocol import EngineSet


def step(call: Coroutine[Any, Any, None]) -> bool:
    """Run an admission `call` by hand up to where it waits for its turn (False) or to its
    return (True): the state machine driven step by step, no event loop turn involved."""
    try:
        call.send(None)
    except StopIteration:
        return True
    return False


def test_the_rule_alone_stimuli_in_who_may_call_out() -> None:
    """The pure rule, no event loop: the oldest fit; an idle engine lets the next one in line
    make one call; a turn given up passes on."""
    rule = AdmissionRule(capacity_tokens=100)
    for rank, name in enumerate("abc"):
        rule.set_context(name, rank=rank, tokens=60)
    assert rule.admitted() == ["a"] and [rule.may_call(p) for p in "abc"] == [True, False, False]
    rule.ask("c")  # nobody calls: the engine is idle, so c may make one call
    assert rule.may_call("c") and not rule.may_call("b")
    rule.ask("b")
    assert not rule.may_call("b")  # c holds the idle turn
    rule.give_up("c")  # c was cancelled before it called: its turn passes to b
    assert rule.may_call("b") and not rule.may_call("c")
    rule.start("b")
    rule.ask("c")
    assert not rule.may_call("c")  # b is calling: not idle
    rule.leave("a")  # b is now the oldest: admitted; c still does not fit beside it
    assert rule.admitted() == ["b"] and not rule.may_call("c")
    rule.done("b")
    assert rule.may_call("c")  # idle again: c's turn
    assert rule.may_call("unknown")


def test_the_oldest_programs_whose_contexts_fit_are_admitted() -> None:
    admission = ProgramAdmission(100)
    admission.set_context("young", rank=2, tokens=30)
    admission.set_context("old", rank=1, tokens=60)
    assert admission.admitted() == ["old", "young"]
    admission.set_context("older", rank=0, tokens=30)  # counts from its first call on
    assert admission.admitted() == ["older", "old"]  # 30 + 60 fit, + 30 does not
    assert not admission.may_call("young")
    admission.leave("old")
    assert admission.admitted() == ["older", "young"]


def test_the_oldest_program_is_admitted_even_alone_too_large() -> None:
    admission = ProgramAdmission(100, overcommit=1.5)
    admission.set_context("big", rank=0, tokens=500)
    admission.set_context("small", rank=1, tokens=1)
    assert admission.admitted() == ["big"]
    admission.set_context("big", rank=0, tokens=140)  # compaction shrank it
    assert admission.admitted() == ["big", "small"]  # 141 <= 150
    with pytest.raises(ValueError, match="overcommit"):
        ProgramAdmission(100, overcommit=0)
    with pytest.raises(ValueError, match="capacity"):
        ProgramAdmission(0)


async def test_a_waiting_program_goes_when_an_older_one_leaves_and_growth_suspends_at_the_next_call() -> None:
    admission = ProgramAdmission(100)
    admission.set_context("a", rank=0, tokens=50)
    admission.set_context("b", rank=1, tokens=50)
    await admission.call("a")
    await admission.call("b")  # both fit
    admission.set_context("a", rank=0, tokens=80)  # a's context grew: b no longer fits...
    admission.done("b")  # ...but b's call under way was never interrupted
    admission.set_context("b", rank=1, tokens=50)
    waiting = admission.call("b")
    assert not step(waiting)  # a is calling, so the engine is not idle: b waits
    assert not admission.may_call("b")
    admission.leave("a")
    assert admission.may_call("b")
    assert step(waiting)  # its turn: the call goes on
    assert admission.admitted() == ["b"]


async def test_while_nobody_calls_the_next_in_line_may_one_at_a_time() -> None:
    admission = ProgramAdmission(10)
    for i, name in enumerate("abc"):
        admission.set_context(name, rank=i, tokens=10)
    assert admission.admitted() == ["a"]  # a waits on a tool: not calling
    b, c = admission.call("b"), admission.call("c")
    assert step(b) and not step(c)  # the engine was idle: b's turn, c still waits
    admission.done("b")
    assert step(c)  # b's call ended and a is still away: c's turn
    assert admission.admitted() == ["a"]


async def test_a_cancelled_waiter_passes_its_turn_on() -> None:
    admission = ProgramAdmission(10)
    for i, name in enumerate("abc"):
        admission.set_context(name, rank=i, tokens=10)
    await admission.call("a")
    b, c = admission.call("b"), admission.call("c")
    assert not step(b) and not step(c)  # a is calling: both wait
    admission.done("a")  # idle: b gets the turn...
    assert admission.may_call("b") and not admission.may_call("c")
    with pytest.raises(asyncio.CancelledError):
        b.throw(asyncio.CancelledError())  # ...but b's caller is gone before it resumes
    assert admission.may_call("c")
    assert step(c)  # the turn passed on to c


# -- through the runtime, on the simulated engine's KV pool ---------------------------------------
def _words(tag: str, n: int) -> str:
    """n words and a trailing space, so an answer appended to it is words of its own."""
    return " ".join(f"{tag}{i}" for i in range(n)) + " "


async def test_programs_beyond_the_pool_wait_and_answers_do_not_change() -> None:
    pool = 8 * BLOCK_TOKENS
    prompts = {p: _words(p, 5 * BLOCK_TOKENS) for p in ("a", "b")}  # one fits the pool, two do not

    async def run(features: AgentFeatures) -> tuple[list[str], list[int]]:
        llm = SimLLM(LLM, time_scale=0.0, cache_tokens=pool, kv_pool=True)
        agents = AgentRuntime(EngineSet().add(llm), features=features)
        assert llm.kv_capacity_tokens() == pool and llm.count_tokens("x y") == 2
        a, b = agents.program("a"), agents.program("b")
        under_way = running(agents.runtime, "llm")
        first = asyncio.ensure_future(a.generate(prompts["a"], engine="llm", max_tokens=4))
        await under_way.wait()  # a's call passed admission: its prefill runs on the engine
        admission = agents.admission("llm")
        if admission is not None:
            assert admission.admitted() == ["a"]
        second = asyncio.ensure_future(b.generate(prompts["b"], engine="llm", max_tokens=4))
        answers = list(await asyncio.gather(first, second))
        waits = [a.stats.admission_waits, b.stats.admission_waits]
        await agents.close()
        await llm.close()
        return answers, waits

    with_admission, waits = await run(AgentFeatures.only("admission"))
    without, no_waits = await run(AgentFeatures.none())
    assert with_admission == without
    assert waits == [0, 1] and no_waits == [0, 0]


@pytest.mark.parametrize("retention", [True, False])
async def test_a_finished_program_s_private_kv_is_evicted_first(retention: bool) -> None:
    shared = _words("system", 2 * BLOCK_TOKENS)
    llm = SimLLM(LLM, time_scale=0.0, cache_tokens=8 * BLOCK_TOKENS)
    agents = AgentRuntime(EngineSet().add(llm), features=AgentFeatures(kv_retention=retention))
    done, running = agents.program("done"), agents.program("running")
    own = shared + _words("r", 2 * BLOCK_TOKENS)
    await running.generate(own, engine="llm", max_tokens=1)
    await done.generate(shared + _words("d", 2 * BLOCK_TOKENS), engine="llm", max_tokens=1)
    done.finish()  # its blocks were the most recent; with retention they now go first
    await running.generate(shared + _words("x", 4 * BLOCK_TOKENS), engine="llm", max_tokens=1)  # evicts two
    await running.generate(own, engine="llm", max_tokens=1)
    assert (llm.stats.recomputed_tokens == 0) == retention  # running's context survived; the shared one too
    running.finish()
    await agents.close()
    await llm.close()


def test_by_attained_service_programs_with_fewer_calls_go_first_and_fill_the_room_left() -> None:
    """`order="attained"`: the line is by calls made in doubling levels (0, 1, 2-3, 4-7, ...),
    the oldest first within a level; whoever fits the room left goes in."""
    rule = AdmissionRule(capacity_tokens=100, order="attained")
    rule.set_context("long", rank=0, tokens=50)
    for _ in range(4):  # four calls: level 3
        rule.ask("long")
        rule.start("long")
        rule.done("long")
    rule.set_context("mid", rank=1, tokens=40)
    rule.ask("mid")
    rule.start("mid")
    rule.done("mid")  # one call: level 1
    rule.set_context("new", rank=2, tokens=70)  # no call yet: level 0, first in line
    assert rule.admitted() == ["new"]  # mid (40) and long (50) do not fit beside it
    rule.set_context("new", rank=2, tokens=50)
    assert rule.admitted() == ["new", "mid"]  # 50 + 40; long would make 140
    rule.set_context("mid", rank=1, tokens=60)
    assert rule.admitted() == ["new", "long"]  # mid no longer fits, long (older, more calls) does
    rule.set_order("start")  # the same programs by start: long, mid, new
    assert rule.admitted() == ["long"]  # 50 + 60 > 100, and nobody overtakes mid


def test_an_unknown_admission_order_is_named() -> None:
    with pytest.raises(ValueError, match="admission order must be one of"):
        AdmissionRule(100, order="shortest")  # type: ignore[arg-type]


def test_by_attained_service_a_program_moves_up_as_its_call_starts_and_its_room_passes_on_at_once() -> None:
    """A program whose call moves it up a level out of the room is not stopped (its call
    runs on, `go` stays), but the next program in line may call at once."""
    rule = AdmissionRule(capacity_tokens=100, order="attained")
    rule.set_context("a", rank=0, tokens=60)
    rule.set_context("b", rank=1, tokens=60)
    assert rule.admitted() == ["a"] and not rule.may_call("b")
    rule.ask("a")
    rule.start("a")  # a's first call: a is at level 1 now, b (level 0) first in line
    assert rule.admitted() == ["b"] and rule.may_call("b") and rule.may_call("a")  # a's call runs on
    rule.done("a")
    assert not rule.may_call("a")  # a's next call waits for room


def test_by_attained_service_an_idle_engine_lets_the_first_waiting_program_in_line_through() -> None:
    rule = AdmissionRule(capacity_tokens=100, order="attained")
    rule.set_context("long", rank=0, tokens=90)
    for _ in range(2):
        rule.ask("long")
        rule.start("long")
        rule.done("long")  # two calls: level 2
    rule.set_context("new", rank=1, tokens=90)  # level 0: first in line, admitted; long no longer fits
    rule.leave("new")
    rule.set_context("x", rank=2, tokens=200)  # level 0 and alone in line: admitted, though larger than the pool
    assert rule.admitted() == ["x"]
    rule.ask("long")
    assert rule.may_call("long")  # nobody calls: the idle engine lets the next waiting one through


def test_a_program_waiting_goes_when_a_new_order_admits_it() -> None:
    async def scenario() -> bool:
        admission = ProgramAdmission(100)
        admission.set_context("old", rank=0, tokens=60)
        await admission.call("old")
        admission.done("old")  # old: one call ended, level 1
        admission.set_context("busy", rank=2, tokens=30)
        await admission.call("busy")  # calling: the engine is not idle
        admission.set_context("young", rank=1, tokens=60)
        waiting = asyncio.create_task(admission.call("young"))
        await asyncio.sleep(0)
        assert not waiting.done()  # by start, old is first and young does not fit beside it
        admission.set_order("attained")  # young (no call yet) is first in line now, beside busy's 30
        await asyncio.wait_for(waiting, 5)  # let through: its call started (and moved it to level 1)
        return admission.rule.entries["young"].calling == 1

    assert asyncio.run(scenario())
