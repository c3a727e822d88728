"""Faults in the local runtime: no engine slot leaks, deadlines name the step, one error per query.

No sleeps: the races are driven through the event loop's own order (FIFO callbacks), and
deadlines run on the virtual-time loop, where a 600 s timeout passes in no real time.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import pytest
from test_local_runtime import Gated, Raising, Toy, embed_only, engines

from teola_adapters.simulated.virtual_time import run_virtual
from teola_core.engines.protocol import Call, CallResult, EngineLimits
from teola_core.ir.builder import GraphBuilder
from teola_core.ir.errors import PrimitiveError
from teola_core.ir.types import PortType
from teola_core.runtime.local import LocalRuntime
from teola_core.runtime.timeouts import DEFAULT_TIMEOUT_S, Timeouts
from teola_core.scheduler.events import RunBatch


def _spy_batches(rt: LocalRuntime, engine: str) -> list[RunBatch]:
    """Every batch the engine's scheduler starts (the pure machine's actions, recorded)."""
    scheduler = rt.scheduler(engine)
    handle = scheduler.handle
    started: list[RunBatch] = []

    def recording(*events: Any) -> Any:
        actions = handle(*events)
        started.extend(a for a in actions if isinstance(a, RunBatch))
        return actions

    scheduler.handle = recording  # type: ignore[method-assign]
    return started


def test_a_cancel_in_the_turn_its_batch_starts_frees_the_slot() -> None:
    """The leak of issue 13: the caller is cancelled in the loop turn in which its batch is
    started, so the batch task is cancelled before its first step and its coroutine never
    runs. 70 times on an engine with one slot (the LangChain model engine has 64): every
    slot comes back, and a query afterwards runs."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        gated = Gated("emb", EngineLimits(concurrency=1))
        rt = LocalRuntime(engines(gated))
        started = _spy_batches(rt, "emb")
        g = embed_only(stages=1)
        for i in range(70):
            caller = loop.create_task(rt.run(g, {"docs": ["a"]}, query_id=f"c{i}"))
            # FIFO: the caller submits (scheduling the engine flush), then this cancel runs,
            # so the caller's wake-up lands right after the flush that starts its batch.
            loop.call_soon(caller.cancel)
            with pytest.raises(asyncio.CancelledError):
                await caller
            assert [c.query_id for c in started[-1].calls] == [f"c{i}"]  # its batch was started ...
        assert gated.batches == []  # ... and never ran a step: exactly the race
        assert len(started) == 70
        await rt.idle()
        assert rt.slots_held == 0 and rt.scheduler("emb").pending == 0
        gated.gate.set()
        assert await rt.run(g, {"docs": ["b"]}) == {"vectors": ["B"]}
        await rt.idle()
        assert rt.slots_held == 0
        await rt.close()

    asyncio.run(main())


def test_a_batch_another_query_still_needs_is_not_cancelled() -> None:
    async def main() -> None:
        gated = Gated("emb", EngineLimits(max_batch_items=8))
        rt = LocalRuntime(engines(gated))
        g = embed_only(stages=1)
        a = asyncio.create_task(rt.run(g, {"docs": ["a"]}, query_id="A"))
        b = asyncio.create_task(rt.run(g, {"docs": ["b"]}, query_id="B"))
        await gated.started.wait()  # one batch holds both queries' calls
        assert gated.batches == [["A:embed", "B:embed"]]
        a.cancel()
        with pytest.raises(asyncio.CancelledError):
            await a
        assert gated.cancelled == []  # B still needs the batch
        gated.gate.set()
        assert await b == {"vectors": ["B"]}
        await rt.idle()
        assert rt.slots_held == 0
        await rt.close()

    asyncio.run(main())


class Hung(Toy):
    """Answers every call at once, except those whose input says "hang": they never return."""

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        if any("hang" in repr(dict(c.inputs)) for c in calls):
            await asyncio.Event().wait()
        return await super().run(calls)


def test_a_hung_engine_fails_its_query_at_the_default_timeout_and_the_others_return() -> None:
    async def main() -> tuple[list[Any], float]:
        loop = asyncio.get_running_loop()
        rt = LocalRuntime(engines(Hung("emb", EngineLimits(max_batch_items=1, concurrency=2))))
        begin = loop.time()
        results = await asyncio.gather(
            *(rt.run(embed_only(stages=1), {"docs": [d]}) for d in ("a", "hang", "b", "c")), return_exceptions=True
        )
        elapsed = loop.time() - begin
        await rt.idle()
        assert rt.slots_held == 0
        await rt.close()
        return results, elapsed

    (a, hung, b, c), elapsed = run_virtual(main())
    assert (a, b, c) == ({"vectors": ["A"]}, {"vectors": ["B"]}, {"vectors": ["C"]})
    assert isinstance(hung, PrimitiveError) and isinstance(hung.error, TimeoutError)
    assert str(hung.error) == (
        "step embed (embed on emb) ran past its 600 s timeout on engine 'emb' (the runtime's Timeouts.engine_s)"
    )
    assert elapsed == pytest.approx(DEFAULT_TIMEOUT_S)  # virtual seconds


def _user_step_graph() -> Any:
    b = GraphBuilder("steps")
    x = b.input("x", PortType.ANY)

    async def maybe_hang(x: str) -> str:
        if x == "hang":
            await asyncio.Event().wait()
        return x.upper()

    b.output(v=b.call(maybe_hang, {"x": x}, name="maybe_hang"))
    return b.build()


def test_a_hung_user_step_fails_its_own_query_naming_the_step() -> None:
    async def main() -> tuple[list[Any], float]:
        loop = asyncio.get_running_loop()
        rt = LocalRuntime(engines(), timeouts=Timeouts(step_s=5))
        g = _user_step_graph()
        begin = loop.time()
        results = await asyncio.gather(*(rt.run(g, {"x": x}) for x in ("a", "hang", "b")), return_exceptions=True)
        elapsed = loop.time() - begin
        await rt.close()
        return results, elapsed

    (a, hung, b), elapsed = run_virtual(main())
    assert (a, b) == ({"v": "A"}, {"v": "B"})
    assert isinstance(hung, PrimitiveError) and isinstance(hung.error, TimeoutError)
    assert str(hung.error) == "step maybe_hang (call) ran past its 5 s timeout (the runtime's Timeouts.step_s)"
    assert elapsed == pytest.approx(5.0)


def test_an_engines_own_timeout_wins_and_inf_means_none() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        rt = LocalRuntime(engines(Hung("emb", EngineLimits(timeout_s=30))), timeouts=Timeouts(engine_s=5))
        begin = loop.time()
        with pytest.raises(PrimitiveError, match=r"30 s timeout on engine 'emb' \(the engine's EngineLimits"):
            await rt.run(embed_only(stages=1), {"docs": ["hang"]})
        assert loop.time() - begin == pytest.approx(30.0)
        rt.timeouts = Timeouts(step_s=math.inf)  # replaceable, e.g. by `teola serve --timeout`
        task = asyncio.create_task(rt.run(_user_step_graph(), {"x": "hang"}))
        done, _ = await asyncio.wait({task}, timeout=10 * DEFAULT_TIMEOUT_S)
        assert not done  # no limit: still waiting after 6000 virtual seconds
        await rt.close()

    run_virtual(main())


def test_timeouts_are_validated_and_built_from_a_number() -> None:
    assert Timeouts.of(None) == Timeouts() == Timeouts(DEFAULT_TIMEOUT_S, DEFAULT_TIMEOUT_S)
    assert Timeouts.of(30) == Timeouts(engine_s=30, step_s=30)
    custom = Timeouts(engine_s=1, step_s=2)
    assert Timeouts.of(custom) is custom
    assert custom.for_engine(EngineLimits()) == 1 and custom.for_engine(EngineLimits(timeout_s=9)) == 9
    for bad in (0, -1, float("nan"), "10"):
        with pytest.raises(ValueError, match=r"Timeouts\.engine_s must be a number of seconds > 0"):
            Timeouts(engine_s=bad)  # type: ignore[arg-type]


def test_each_query_of_a_failed_batch_gets_its_own_exception() -> None:
    async def main() -> list[Any]:
        rt = LocalRuntime(engines(Raising("emb", EngineLimits(max_batch_items=16))))
        g = embed_only(stages=1)
        results = await asyncio.gather(*(rt.run(g, {"docs": [str(i)]}) for i in range(8)), return_exceptions=True)
        await rt.close()
        return results

    results = run_virtual(main())
    errors = [r.error for r in results]
    assert all(isinstance(r, PrimitiveError) for r in results)
    assert len({id(e) for e in errors}) == 8  # distinct objects ...
    assert all(type(e) is ConnectionError and str(e) == "engine is down" for e in errors)  # ... of the user's type
    (original,) = {id(e.__cause__): e.__cause__ for e in errors}.values()  # ... caused by the one original
    assert isinstance(original, ConnectionError) and original not in errors
    for e in errors:  # what an adapter does when it re-raises the user's exception
        e.add_note("teola: raised in primitive embed")
    assert all(e.__notes__ == ["teola: raised in primitive embed"] for e in errors)
    assert not hasattr(original, "__notes__")


def test_an_engine_returning_one_exception_for_several_calls_is_split_too() -> None:
    class SharedFailure(Toy):
        async def run(self, calls: Sequence[Call]) -> list[CallResult]:
            shared = ValueError("bad input")
            return [shared for _ in calls]

    async def main() -> list[Any]:
        rt = LocalRuntime(engines(SharedFailure("emb", EngineLimits(max_batch_items=4))))
        results = await asyncio.gather(
            *(rt.run(embed_only(stages=1), {"docs": [str(i)]}) for i in range(3)), return_exceptions=True
        )
        await rt.close()
        return results

    errors = [r.error for r in run_virtual(main())]
    assert len({id(e) for e in errors}) == 3 and len({id(e.__cause__) for e in errors}) == 1
