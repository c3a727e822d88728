"""The admission machine: events in, exact actions out (no server, no clock); the gate on
the virtual-time loop; the loop-lag monitor on a virtual-time loop it sees blocked."""

from __future__ import annotations

import asyncio

import pytest

from teola.server.admission import Admission, Admit, Gate, Overloaded, Shed
from teola.server.lag import LoopLag
from teola_adapters.simulated.virtual_time import VirtualTimeLoop, run_virtual


def test_admit_queue_shed_and_hand_over_in_order() -> None:
    a = Admission(max_limit=2, queue=2)
    assert a.arrive(1) == [Admit(1)] and a.arrive(2) == [Admit(2)]
    assert a.arrive(3) == [] and a.arrive(4) == []  # queued
    assert a.full and a.arrive(5) == [Shed(5, "queue_full")]
    assert a.leave(5) == []  # a shed request leaving changes nothing
    assert a.leave(1) == [Admit(3)]  # the oldest waiting request gets the slot
    assert a.expire(4) == [Shed(4, "queue_timeout")] and a.expire(3) == []  # 3 runs already
    assert a.leave(2) == [] and a.leave(3) == []
    assert a.running == set() and not a.waiting


def test_a_queued_request_that_leaves_frees_its_place() -> None:
    a = Admission(max_limit=1, queue=1)
    a.arrive(1)
    a.arrive(2)
    assert a.leave(2) == []  # its client left while it waited
    assert a.arrive(3) == [] and a.leave(1) == [Admit(3)]


def run(a: Admission, ticket: int, seconds: float) -> list[Admit | Shed]:
    """Ticket `ticket` runs and ends after `seconds` (a new request takes its place)."""
    a.arrive(ticket)
    return a.finished(ticket, seconds)


def test_the_limit_shrinks_when_admitting_more_only_slows_queries_down() -> None:
    a = Admission(max_limit=64, min_limit=4)
    for ticket in range(64):  # busy: the limit is what binds
        a.arrive(ticket)
    for ticket in range(64, 264):  # steady run times: the limit stays at its maximum
        a.finished(ticket - 64, 0.05)
        a.arrive(ticket)
    assert a.limit == 64
    for slow in range(264, 664):  # then each query takes 4x as long: the limit falls ...
        a.finished(min(a.running), 0.2)
        a.arrive(slow)
    assert 4 <= a.limit <= 16 and a.queue == 64  # ... the queue stays (its wait is bounded in time)


def test_varying_run_times_do_not_shrink_the_limit() -> None:
    a = Admission(max_limit=64, min_limit=4)
    for ticket in range(64):
        a.arrive(ticket)
    for ticket in range(64, 1064):  # short and long answers alike, as an LLM app's
        a.finished(ticket - 64, 0.02 if ticket % 3 else 0.5)
        a.arrive(ticket)
    assert a.limit == 64


def test_the_limit_recovers_when_queries_are_fast_again_and_does_not_grow_when_idle() -> None:
    a = Admission(max_limit=64, queue=1000, min_limit=4, start=8)
    for ticket in range(1000):  # a backlog: 8 run, the rest wait
        a.arrive(ticket)
    for _ in range(400):  # each fast answer hands its slot on (and may open more)
        a.finished(min(a.running), 0.05)
    assert a.limit == 64 and len(a.running) == 64
    idle = Admission(max_limit=64, min_limit=4, start=8)
    for ticket in range(100):  # one request at a time: the limit is not what binds
        run(idle, ticket, 0.05)
    assert idle.limit == 8


def test_the_gate_waits_at_most_its_deadline_in_virtual_time() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        gate = Gate(Admission(max_limit=1, queue=1), wait_s=2.0)
        first = gate.ticket()
        await gate.enter(first)
        second = gate.ticket()
        began = loop.time()
        with pytest.raises(Overloaded, match="waited too long") as info:
            await gate.enter(second)
        assert info.value.reason == "queue_timeout" and loop.time() - began == pytest.approx(2.0)
        gate.leave(second)
        third = gate.ticket()
        waiting = asyncio.create_task(gate.enter(third))
        await asyncio.sleep(0.5)  # virtual time: the third waits while the first runs
        assert not waiting.done() and gate.waiting == 1
        gate.leave(first)
        await waiting  # handed the slot
        assert gate.running == 1
        gate.leave(third)

    run_virtual(main())


def test_a_waiter_cancelled_after_being_admitted_gives_its_slot_back() -> None:
    async def main() -> None:
        gate = Gate(Admission(max_limit=1, queue=1), wait_s=60.0)
        first, second = gate.ticket(), gate.ticket()
        await gate.enter(first)
        waiting = asyncio.create_task(gate.enter(second))
        await asyncio.sleep(1.0)  # virtual time: it runs until it waits (its deadline is 60 s away)
        assert gate.waiting == 1 and not waiting.done()
        gate.leave(first)  # it is admitted (its future set) ...
        waiting.cancel()  # ... and its client leaves before it resumes
        with pytest.raises(asyncio.CancelledError):
            await waiting
        gate.leave(second)  # what the route does in its `finally`
        assert gate.running == 0 and gate.waiting == 0

    run_virtual(main())


class StallingLoop(VirtualTimeLoop):
    """Virtual time that a test can also move without running anything: a blocked loop."""

    stalled = 0.0

    def time(self) -> float:
        return super().time() + self.stalled


def test_loop_lag_says_how_far_behind_the_loop_is() -> None:
    async def main() -> tuple[float, float, float]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, StallingLoop)
        lag = LoopLag(interval=0.05)
        lag.start()  # the first tick is due in 0.05 s
        on_time = lag.behind()
        loop.stalled += 0.1  # the loop is blocked for 0.1 s: its clock moves, nothing runs
        blocked = lag.behind()
        await asyncio.sleep(0.01)  # the overdue tick runs first, and measures how late it is
        measured = lag.behind()
        lag.stop()
        return on_time, blocked, measured

    with asyncio.Runner(loop_factory=StallingLoop) as runner:
        on_time, blocked, measured = runner.run(main())
    assert on_time == 0.0
    assert blocked == pytest.approx(0.05) and measured == pytest.approx(0.05)  # 0.1 s blocked, 0.05 s of it late
