"""An asyncio event loop whose clock jumps to the next timer: simulated runs, exact and fast.

    result = run_virtual(bench(workload, rate=0.5, queries=40))   # seconds of CPU, no sleeping

Whenever nothing is ready to run, `loop.time()` jumps to the next timer instead of
sleeping, so a run is repeatable, immune to CPU load, and takes only its CPU time (which
counts as zero simulated time). Real I/O still works (the selector is polled); threads
are not waited for, so a simulation that hands work to threads must run on a real clock.
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
