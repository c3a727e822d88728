"""An asyncio event loop whose clock jumps: simulated runs that are exact and fast.

A benchmark on simulated engines only waits: engines sleep their profiled latency, tools
sleep their durations. On a real clock, a run of 32 agents for twenty simulated minutes
either takes twenty minutes or is scaled down until the interpreter's own CPU time
(milliseconds per call) shows up as simulated seconds and load on the machine changes
the result. On this loop, `loop.time()` is virtual: whenever nothing is ready to run,
time jumps to the next timer instead of sleeping. Everything the simulation does is then
free of wall-clock noise and repeatable, and a run takes only its CPU time.

Real I/O still works (the selector is polled); with no timer pending, the loop blocks
on it as usual. Threads are not waited for in virtual time: a simulation that hands
work to threads should not use this loop.

    result = run_virtual(bench_agents(concurrency=32, time_scale=1.0))
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector loop whose `time()` advances only by jumping to the next timer."""

    def __init__(self) -> None:
        super().__init__(selectors.DefaultSelector())
        self._virtual_now = 0.0
        real_select = self._selector.select  # type: ignore[attr-defined]

        def select(timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
            if timeout is None:
                return real_select(None)  # nothing scheduled: wait for real I/O
            events = real_select(0)
            if not events and timeout > 0:
                self._virtual_now += timeout  # the loop would have slept until its next timer
            return events

        self._selector.select = select  # type: ignore[attr-defined]

    def time(self) -> float:
        return self._virtual_now


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on a fresh `VirtualTimeLoop`."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main)
