"""Spending simulated engine time, and the bookkeeping every simulated engine shares.

A simulated engine charges the latency its profile gives for the work it does, scaled
by `time_scale` (0 waits not at all, so tests and overhead benchmarks run instantly).
It also adds the *unscaled* latency to `busy_s`, so tests can assert on simulated time
exactly instead of on wall-clock sleeps.

    clock = SimClock(time_scale=0.1)
    async with clock.slot():          # one of `concurrency` instances is busy
        await clock.spend(0.45)       # sleeps 45 ms, busy_s += 0.45
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any


def check_time_scale(time_scale: float) -> float:
    if not time_scale >= 0:  # also rejects NaN
        raise ValueError(f"time_scale must be >= 0, got {time_scale!r}")
    return float(time_scale)


def stable_hash(*parts: str, size: int = 8) -> int:
    """A hash of strings that is the same in every process (unlike the salted `hash()`)."""
    h = hashlib.blake2b(digest_size=size)
    for part in parts:
        data = part.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return int.from_bytes(h.digest(), "little")


def count_items(value: Any) -> int:
    """How many items a list input carries (0 for anything else: that call fails later)."""
    return len(value) if isinstance(value, list | tuple) else 0


@dataclass
class EngineStats:
    """What a non-LLM simulated engine did: batches run, calls and items in them, time."""

    batches: int = 0
    calls: int = 0
    items: int = 0
    busy_s: float = 0.0  # simulated, unscaled seconds

    @classmethod
    def combined(cls, parts: Iterable[EngineStats]) -> EngineStats:
        """The stats of several instances added up."""
        total = cls()
        for p in parts:
            total.batches, total.calls = total.batches + p.batches, total.calls + p.calls
            total.items, total.busy_s = total.items + p.items, total.busy_s + p.busy_s
        return total

    def record(self, calls: int, items: int, seconds: float) -> None:
        self.batches += 1
        self.calls += calls
        self.items += items
        self.busy_s += seconds


class SimClock:
    """Sleeps `seconds * time_scale` and limits how many batches run at once.

    Timer granularity: the event loop wakes up to ~1 ms late (epoll rounds its timeout
    up to whole milliseconds), which at a small time scale would inflate a 1.25 ms
    decode step by 80 %. The clock keeps that lateness as a debt (at most
    `MAX_DEBT_S`) and sleeps that much less next time, so back-to-back work (an LLM's
    steps, a queue of batches) takes its profiled time on average. The cap keeps a
    long stall of the event loop (someone else's CPU work) from being paid back as
    free engine time later.

    `now()` is the engine's simulated time, in unscaled seconds: the event loop's time
    since the clock was first read or spent divided by `time_scale`, so it runs at the pace of everything else
    scaled the same way (a benchmark's tool sleeps); at time scale 0, where no wall
    time passes, it is the seconds spent so far, so only the engine's own work moves it
    (meaningful for one spender at a time, as an LLM's step loop).

    The gate models the engine's instances: a simulated engine with one instance runs
    one batch at a time even if a caller ignores its limits, as a real GPU would. The
    semaphore is made per event loop, because asyncio primitives bind to the loop that
    first waits on them (tests run one loop each).
    """

    MAX_DEBT_S = 0.002

    def __init__(self, time_scale: float, concurrency: int = 1) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.time_scale = check_time_scale(time_scale)
        self.concurrency = concurrency
        self._debt = 0.0
        self._spent = 0.0  # unscaled seconds passed to spend()
        self._origin: float | None = None  # set by the first now() or spend()
        self._gate: asyncio.Semaphore | None = None
        self._gate_loop: asyncio.AbstractEventLoop | None = None

    async def spend(self, seconds: float, *, always_yield: bool = False) -> None:
        """Wait for `seconds` of simulated work (no wait at all when scaled to zero).

        always_yield: give other tasks a turn even when no time is spent (a step loop
        must let callers submit work between steps).
        """
        self._spent += seconds
        self.now()  # the simulated clock starts with the engine's first work, if not read before
        scaled = seconds * self.time_scale
        if scaled <= self._debt:  # nothing to spend, or already spent by an earlier late wake-up
            self._debt -= scaled
            if always_yield:
                await asyncio.sleep(0)
            return
        target = scaled - self._debt
        loop = asyncio.get_running_loop()
        began = loop.time()
        await asyncio.sleep(target)
        self._debt = min(max(0.0, loop.time() - began - target), self.MAX_DEBT_S)

    def now(self) -> float:
        """Simulated seconds since the clock was made (see the class docstring)."""
        if self.time_scale == 0:
            return self._spent
        try:
            t = asyncio.get_running_loop().time()  # the loop's clock (virtual under a simulated loop)
        except RuntimeError:
            t = time.monotonic()  # outside a loop: asyncio's default clock
        if self._origin is None:
            self._origin = t
        return (t - self._origin) / self.time_scale

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        if self._gate is None or self._gate_loop is not loop:
            self._gate, self._gate_loop = asyncio.Semaphore(self.concurrency), loop
        async with self._gate:
            yield

    async def spend_batch(self, seconds: float, stats: EngineStats, calls: int, items: int) -> None:
        """Run one batch: hold an instance for its `seconds`, then count it in `stats`.

        The counting stays inside the slot, so stats never show a batch before its time is spent.
        """
        async with self.slot():
            await self.spend(seconds)
            stats.record(calls, items, seconds)
