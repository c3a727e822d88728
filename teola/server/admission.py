"""Overload control for one served app: bounded work, a bounded wait, shedding.

At most `limit` queries of the app run at once; up to `queue` more wait (by default as
many as may ever run), first come first served, each at most `wait_s`; a request that
finds the queue full, or waits past its deadline, is shed (the route answers 503 with
`Retry-After`, which the OpenAI clients retry). Work admitted is never more than the
server can serve, so under overload it keeps answering at capacity instead of slowing
every request down until all miss their deadlines.

`limit` adapts between `min_limit` and `max_limit` (the engines' capacity, or
`--max-concurrency`) to how long admitted queries take, as TCP Vegas (and Netflix's
concurrency-limits) do: the median run time of each window of answers against the
lowest recent window median (the time a query needs when nothing queues) estimates how
many of the running queries are only queueing, `limit x (1 - base / median)`. Up to half
the limit (at least 8: run times may double before it shrinks) the limit grows by its
square root, while it is what binds; past it the limit drops by half the excess. Medians of windows, not single run
times, so answers of very different lengths (an LLM's) do not read as queueing; each
query's time in the server stays near what the app needs, far from the clients'
deadlines, whatever the server can actually do (its CPU, taken by others or not).

`Admission` is a pure state machine (events in, actions out, no clock, no I/O); `Gate`
drives it on the event loop:

    gate = Gate(Admission(max_limit=64, queue=64), wait_s=2.0)
    ticket = gate.ticket()
    try:
        await gate.enter(ticket)       # raises Overloaded when shed
        answer = await app.ainvoke(value)
    finally:
        gate.leave(ticket)
"""

from __future__ import annotations

import asyncio
import math
import statistics
from collections import OrderedDict, deque
from dataclasses import dataclass
from itertools import count
from typing import Literal

ShedReason = Literal["queue_full", "queue_timeout"]


@dataclass(frozen=True, slots=True)
class Admit:
    """Request `ticket` may run now (it holds one of the `limit` slots until it leaves)."""

    ticket: int


@dataclass(frozen=True, slots=True)
class Shed:
    ticket: int
    reason: ShedReason


class Admission:
    """running: tickets holding a slot; waiting: tickets queued, oldest first; limit: slots now."""

    def __init__(
        self,
        max_limit: int,
        queue: int | None = None,
        *,
        min_limit: int = 8,
        start: int | None = None,
    ) -> None:
        if max_limit < 1 or (queue is not None and queue < 0) or min_limit < 1:
            raise ValueError(f"admission needs limits >= 1 and queue >= 0, got {max_limit=}, {min_limit=}, {queue=}")
        self.max_limit = max_limit
        self.min_limit = min(min_limit, max_limit)
        self.limit = max(self.min_limit, min(max_limit, start if start is not None else max_limit))
        self.queue = max_limit if queue is None else queue
        self._window: list[float] = []  # run times of the current window of answers
        self._medians: deque[float] = deque(maxlen=30)  # recent window medians; their min is the base
        self.running: set[int] = set()
        self.waiting: OrderedDict[int, None] = OrderedDict()

    def arrive(self, ticket: int) -> list[Admit | Shed]:
        """A request wants to run: admitted, queued (no action) or shed."""
        if len(self.running) < self.limit and not self.waiting:
            self.running.add(ticket)
            return [Admit(ticket)]
        if len(self.waiting) >= self.queue:
            return [Shed(ticket, "queue_full")]
        self.waiting[ticket] = None
        return []

    def leave(self, ticket: int) -> list[Admit | Shed]:
        """A request ended (answered, failed, timed out, client gone), queued or running."""
        if ticket in self.waiting:
            del self.waiting[ticket]
            return []
        if ticket not in self.running:
            return []  # it was shed
        self.running.remove(ticket)
        return self._admit_waiting()

    def expire(self, ticket: int) -> list[Admit | Shed]:
        """A queued request's wait deadline passed: shed it (nothing if it runs already)."""
        if ticket not in self.waiting:
            return []
        del self.waiting[ticket]
        return [Shed(ticket, "queue_timeout")]

    def finished(self, ticket: int, run_s: float) -> list[Admit | Shed]:
        """A running request ended after `run_s` seconds: adapt the limit, hand its slot on."""
        if ticket in self.running:
            self._adapt(run_s, busy=len(self.running) >= self.limit / 2)
        return self.leave(ticket)

    def _adapt(self, run_s: float, *, busy: bool) -> None:
        self._window.append(run_s)
        if len(self._window) < max(16, self.limit):
            return
        median = statistics.median(self._window)
        self._window.clear()
        self._medians.append(median)
        base = min(self._medians)
        queueing = self.limit * (1 - base / median) if median > 0 else 0.0
        allowed = max(8.0, self.limit / 2)
        if queueing > allowed:
            self.limit = max(self.min_limit, math.floor(self.limit - (queueing - allowed) / 2))
        elif busy:  # grow only while the limit is what binds
            self.limit = min(self.max_limit, self.limit + max(1, round(self.limit**0.5)))

    @property
    def full(self) -> bool:
        """A request arriving now would be shed at once."""
        return len(self.running) >= self.limit and len(self.waiting) >= self.queue

    def _admit_waiting(self) -> list[Admit | Shed]:
        admitted: list[Admit | Shed] = []
        while self.waiting and len(self.running) < self.limit:
            nxt, _ = self.waiting.popitem(last=False)
            self.running.add(nxt)
            admitted.append(Admit(nxt))
        return admitted


class Overloaded(Exception):
    """The request was shed; `reason` says why (queue full, or waited too long)."""

    def __init__(self, reason: ShedReason, admission: Admission) -> None:
        why = "the wait queue is full" if reason == "queue_full" else "it waited too long for a free slot"
        super().__init__(
            f"{len(admission.running)} queries running (limit {admission.limit}), "
            f"{len(admission.waiting)} waiting (at most {admission.queue}): {why}"
        )
        self.reason = reason


class Gate:
    """An `Admission` on the event loop: a request takes a ticket, waits for its turn at
    most `wait_s`, and gives the ticket back however it ends."""

    def __init__(self, admission: Admission, wait_s: float) -> None:
        self.admission = admission
        self.wait_s = wait_s
        self._tickets = count()
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._admitted: dict[int, float] = {}  # running ticket -> when it was admitted

    @property
    def running(self) -> int:
        return len(self.admission.running)

    @property
    def waiting(self) -> int:
        return len(self.admission.waiting)

    @property
    def full(self) -> bool:
        return self.admission.full

    def ticket(self) -> int:
        return next(self._tickets)

    async def enter(self, ticket: int) -> None:
        await self._enter(ticket)
        self._admitted[ticket] = asyncio.get_running_loop().time()

    async def _enter(self, ticket: int) -> None:
        actions = self.admission.arrive(ticket)
        if actions:
            self._raise_if_shed(actions[0])
            return
        waiter = self._waiters[ticket] = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(self.wait_s):
                await waiter
        except TimeoutError:
            for action in self.admission.expire(ticket):  # none if it was admitted meanwhile
                self._raise_if_shed(action)
        finally:
            self._waiters.pop(ticket, None)

    def leave(self, ticket: int) -> None:
        admitted_at = self._admitted.pop(ticket, None)
        if admitted_at is None:
            self._wake(self.admission.leave(ticket))
        else:
            self._wake(self.admission.finished(ticket, asyncio.get_running_loop().time() - admitted_at))

    def _wake(self, actions: list[Admit | Shed]) -> None:
        for action in actions:
            waiter = self._waiters.get(action.ticket)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def _raise_if_shed(self, action: Admit | Shed) -> None:
        if isinstance(action, Shed):
            raise Overloaded(action.reason, self.admission)
