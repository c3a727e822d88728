"""vLLM's running set and waiting queue for the simulated LLM server (`--max-num-seqs`).

    slots = RequestSlots(max_num_seqs=16, policy="fcfs")
    async with slots.running(priority=0):
        ...                      # one of the 16 running requests; the others wait here

"fcfs": waiting requests start in order of arrival. "priority" (vLLM's
`--scheduling-policy priority`): the lowest `priority` value first, ties by arrival; a
running request is never pre-empted. With no bound every request runs at once. The
counts are what the server's `/metrics` reports (`vllm:num_requests_running`,
`vllm:num_requests_waiting`).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

SchedulingPolicy = Literal["fcfs", "priority"]
SCHEDULING_POLICIES: tuple[str, ...] = ("fcfs", "priority")


class RequestSlots:
    """At most `max_num_seqs` requests run; the rest wait in the policy's order."""

    def __init__(self, max_num_seqs: int | None = None, policy: SchedulingPolicy = "fcfs") -> None:
        if max_num_seqs is not None and max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1 or None, got {max_num_seqs}")
        if policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {SCHEDULING_POLICIES}, got {policy!r}")
        self.max_num_seqs = max_num_seqs
        self.policy = policy
        self.running_count = 0
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()

    @property
    def waiting_count(self) -> int:
        return sum(1 for *_, f in self._waiting if not f.done())

    def check_priority(self, priority: int) -> None:
        """vLLM refuses a non-zero priority unless the server schedules by priority."""
        if priority != 0 and self.policy != "priority":
            raise ValueError(f"priority {priority} given, but the server's scheduling policy is {self.policy!r}")

    @asynccontextmanager
    async def running(self, priority: int = 0) -> AsyncIterator[None]:
        self.check_priority(priority)
        if self.max_num_seqs is not None and (self.running_count >= self.max_num_seqs or self.waiting_count):
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            order = priority if self.policy == "priority" else 0
            heapq.heappush(self._waiting, (order, next(self._arrivals), future))
            try:
                await future  # the slot was handed over: running_count already counts this request
            except asyncio.CancelledError:
                if future.done() and not future.cancelled():
                    self._release()  # handed over as the client left: pass it on
                future.cancel()  # no longer waiting (a no-op if handed over)
                raise
        else:
            self.running_count += 1
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        """A running request ended: its slot goes to the first live waiting request."""
        while self._waiting:
            *_, future = heapq.heappop(self._waiting)
            if not future.done():
                future.set_result(None)
                return
        self.running_count -= 1
