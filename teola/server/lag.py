"""How far behind the server's event loop runs: its own backlog of ready work.

A callback is due every `interval` seconds; `behind()` is how late the last one ran, or
how overdue the next one already is. Under overload the loop falls behind before any
app's queue fills (parsing and routing requests costs CPU too), and a request that
waits in that backlog is invisible to the admission gates; `ShedWhenFull` refuses new
requests while the loop is more than `ServeOptions.max_lag_s` behind.
"""

from __future__ import annotations

import asyncio


class LoopLag:
    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.last = 0.0
        self._due = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._schedule()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def behind(self) -> float:
        if self._loop is None:
            return 0.0
        return max(self.last, self._loop.time() - self._due)

    def _schedule(self) -> None:
        assert self._loop is not None
        self._due = self._loop.time() + self.interval
        self._handle = self._loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        self.last = max(0.0, self._loop.time() - self._due)
        self._schedule()
