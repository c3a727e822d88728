"""The admission machine: events in, exact actions out (no server, no clock); the gate and
the loop-lag monitor on the virtual-time loop."""

from __future__ import annotations

import asyncio

import pytest

from teola.server.admission import Admission, Admit, Gate, Overloaded, Shed
from teola.server.lag import LoopLag
from teola_benchmarks.virtual_time import run_virtual


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


def test_the_limit_follows_the_event_loop_lag() -> None:
    a = Admission(max_limit=64, queue=100, min_limit=4, lag_target_s=0.05)
    for ticket in range(70):
        a.arrive(ticket)
    assert len(a.running) == 64 and len(a.waiting) == 6
    a.lagged(0.2)  # the server's CPU cannot keep up: 10 % fewer slots
    assert a.limit == 57
    for _ in range(50):
        a.lagged(0.2)
    assert a.limit == 4  # never below the floor
    for ticket in range(60):  # the running requests end; nothing is admitted past the limit
        a.leave(ticket)
    assert len(a.running) == 4
    a.lagged(0.04)  # between target/2 and target: hold
    assert a.limit == 4
    assert a.lagged(0.0) == [Admit(64)]  # idle and requests wait: one more slot, taken at once
    assert a.limit == 5


def test_the_limit_does_not_grow_without_demand_or_past_its_maximum() -> None:
    a = Admission(max_limit=3, queue=10)  # the floor (4) is capped at the maximum
    a.lagged(0.5)
    assert a.min_limit == a.limit == 3
    a = Admission(max_limit=8, queue=10, min_limit=2)
    a.lagged(1.0)
    a.lagged(0.0)  # nobody waits: no growth
    assert a.limit == 7
    for ticket in range(20):
        a.arrive(ticket)
    for _ in range(5):
        a.lagged(0.0)
    assert a.limit == 8


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
        await asyncio.sleep(0)  # it queues
        gate.leave(first)  # it is admitted (its future set) ...
        waiting.cancel()  # ... and its client leaves before it resumes
        with pytest.raises(asyncio.CancelledError):
            await waiting
        gate.leave(second)  # what the route does in its `finally`
        assert gate.running == 0 and gate.waiting == 0

    run_virtual(main())


def test_loop_lag_reports_how_late_the_loop_runs() -> None:
    async def main() -> list[float]:
        lag = LoopLag(interval=0.05)
        seen: list[float] = []
        lag.listen(seen.append)
        lag.start()
        await asyncio.sleep(0.2)
        lag.stop()
        return seen

    samples = run_virtual(main())
    assert len(samples) >= 3 and all(s == pytest.approx(0.0, abs=1e-9) for s in samples)
