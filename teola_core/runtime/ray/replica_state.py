"""The records behind a `Replicas`: each slot's state and actor, and the signal its waiters wait on.

`Replicas` (`teola_core.runtime.ray.replicas`) changes these only under its lock; calls on
any thread or event loop wait for a change through the signal.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any

from teola_core.runtime.ray.actor import ActorInfo


class Incarnation:
    """One actor of a slot; a replacement is a new incarnation (calls in flight keep theirs)."""

    __slots__ = ("actor", "info", "load")

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.info: ActorInfo | None = None
        self.load = 0  # calls in flight


class ReplicaSlot:
    """One replica of a pool: its state, its current incarnation and what it has been through."""

    __slots__ = ("current", "final", "last", "restarts", "served", "slot", "state", "why")

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.state = "idle"  # idle -> starting -> ready -> starting (replacement) ... | lost | closed
        self.current: Incarnation | None = None
        self.last: ActorInfo | None = None  # the latest incarnation that was ready
        self.restarts = 0
        self.served = 0
        self.why = ""  # why it is lost
        self.final = False  # lost for good (its engine cannot build, or no restarts left)


class ReplicaSignal:
    """Wakes every waiter, on any thread or event loop, when the pool's replicas change."""

    def __init__(self) -> None:
        self._waiters: list[concurrent.futures.Future[None]] = []

    def waiter(self) -> concurrent.futures.Future[None]:  # call under the pool's lock
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._waiters.append(future)
        return future

    def notify(self) -> None:  # call under the pool's lock
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if future.set_running_or_notify_cancel():
                future.set_result(None)


async def wait_for_change(waiter: concurrent.futures.Future[None], deadline: float) -> None:
    """Wait for the pool's signal (from any thread) until `deadline` (monotonic)."""
    wakeup = asyncio.wrap_future(waiter)
    try:
        await asyncio.wait({wakeup}, timeout=max(0.0, deadline - time.monotonic()))
    finally:
        wakeup.cancel()
