"""vLLM's running set and waiting queue in the simulated server, stepped by hand.

Each waiting request is a coroutine driven with `send(None)`: it runs until it waits for
its slot, so the order in which slots are handed over is read off the futures, with no
scheduling of tasks in between.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from teola_adapters.simulated.servers.slots import RequestSlots


def _wait(slots: RequestSlots, priority: int) -> tuple[AbstractAsyncContextManager[None], Any, asyncio.Future[None]]:
    cm = slots.running(priority)
    entering = cm.__aenter__()
    future = entering.send(None)  # runs until the request waits for its slot
    return cm, entering, future


def _order(policy: str, requests: list[tuple[str, int]]) -> list[str]:
    async def scenario() -> list[str]:
        slots = RequestSlots(1, policy)  # type: ignore[arg-type]
        first = slots.running(0)
        await first.__aenter__()
        waiting = {name: _wait(slots, priority) for name, priority in requests}
        assert slots.running_count == 1 and slots.waiting_count == len(requests)
        order, running = [], first
        while True:
            await running.__aexit__(None, None, None)
            ready = [name for name, (_, _, future) in waiting.items() if future.done()]
            if not ready:
                return order
            (name,) = ready
            cm, entering, _ = waiting.pop(name)
            with pytest.raises(StopIteration):
                entering.send(None)  # it enters its slot
            order.append(name)
            running = cm
            assert slots.running_count == 1

    return asyncio.run(scenario())


def test_fcfs_starts_waiting_requests_in_arrival_order() -> None:
    assert _order("fcfs", [("a", 0), ("b", 0), ("c", 0)]) == ["a", "b", "c"]


def test_priority_starts_the_lowest_value_first_ties_by_arrival() -> None:
    assert _order("priority", [("low", 5), ("high", 1), ("high_later", 1), ("mid", 3)]) == [
        "high",
        "high_later",
        "mid",
        "low",
    ]


def test_a_waiting_request_that_leaves_gives_its_turn_to_the_next() -> None:
    async def scenario() -> None:
        slots = RequestSlots(1)
        first = slots.running(0)
        await first.__aenter__()
        _, leaving, _ = _wait(slots, 0)
        _, staying, staying_turn = _wait(slots, 0)
        with pytest.raises(asyncio.CancelledError):
            leaving.throw(asyncio.CancelledError())  # the client left while waiting
        assert slots.waiting_count == 1
        await first.__aexit__(None, None, None)
        assert staying_turn.done() and slots.running_count == 1
        with pytest.raises(StopIteration):
            staying.send(None)

    asyncio.run(scenario())


def test_no_bound_runs_everything_at_once_and_options_are_checked() -> None:
    async def scenario() -> int:
        slots = RequestSlots(None)
        entered = [slots.running(0) for _ in range(5)]
        for cm in entered:
            await cm.__aenter__()
        return slots.running_count

    assert asyncio.run(scenario()) == 5
    with pytest.raises(ValueError, match="max_num_seqs must be at least 1 or None, got 0"):
        RequestSlots(0)
    with pytest.raises(ValueError, match="priority 2 given, but the server's scheduling policy is 'fcfs'"):
        RequestSlots(1).check_priority(2)
