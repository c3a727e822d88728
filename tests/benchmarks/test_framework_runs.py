"""How the framework benches drive a system: the open loop keeps its arrival times."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from teola_adapters.simulated.virtual_time import run_virtual
from teola_benchmarks.framework_runs import closed_loop
from teola_benchmarks.harness import open_loop


def _slow_echo(started: list[float], seconds: float = 2.0) -> Callable[[int], Awaitable[int]]:
    """A system that answers after `seconds`, noting when each query started."""

    async def ask(x: int) -> int:
        started.append(asyncio.get_running_loop().time())
        await asyncio.sleep(seconds)
        return x * 10

    return ask


def test_open_loop_starts_each_query_at_its_arrival_whatever_the_earlier_ones_do() -> None:
    started: list[float] = []
    latencies, outputs = run_virtual(open_loop(_slow_echo(started), [1, 2, 3], [0.0, 0.5, 3.0]))
    assert started == [0.0, 0.5, 3.0]  # the second does not wait for the first to return
    assert latencies == [2.0, 2.0, 2.0] and outputs == [10, 20, 30]


def test_closed_loop_waits_for_a_worker() -> None:
    started: list[float] = []

    async def run() -> tuple[list[float], list[object]]:
        return await closed_loop(_slow_echo(started), [1, 2, 3], 2)

    _, outputs = run_virtual(run())
    assert started == [0.0, 0.0, 2.0] and outputs == [10, 20, 30]


def test_open_loop_needs_an_arrival_per_input() -> None:
    with pytest.raises(ValueError, match="3 inputs but 2 arrival times"):
        run_virtual(open_loop(_slow_echo([]), [1, 2, 3], [0.0, 1.0]))
