"""Overload control for one served app: bounded work, a bounded wait, shedding.

At most `limit` queries of the app run at once; up to `queue` more wait, first come first
served, each at most `wait_s`; a request that finds the queue full, or waits past its
deadline, is shed (the route answers 503 with `Retry-After`, which the OpenAI clients
retry). Work admitted is never more than the engines can serve, so under overload the
server keeps answering at capacity instead of slowing every request down until all miss
their deadlines.

`Admission` is a pure state machine (events in, actions out, no clock, no I/O); `Gate`
drives it on the event loop:

    gate = Gate(Admission(limit=64, queue=64), wait_s=2.0)
    ticket = gate.ticket()
    try:
        await gate.enter(ticket)       # raises Overloaded when shed
        answer = await app.ainvoke(value)
    finally:
        gate.leave(ticket)
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from itertools import count
from typing import Literal

ShedReason = Literal["queue_full", "queue_timeout"]


@dataclass(frozen=True, slots=True)
class Admit:
    """Request `ticket` may run now (it holds one of the `limit` slots until `Leave`)."""

    ticket: int


@dataclass(frozen=True, slots=True)
class Shed:
    ticket: int
    reason: ShedReason


class Admission:
    """running: tickets holding a slot; waiting: tickets queued, oldest first."""

    def __init__(self, limit: int, queue: int) -> None:
        if limit < 1 or queue < 0:
            raise ValueError(f"admission needs limit >= 1 and queue >= 0, got limit={limit}, queue={queue}")
        self.limit = limit
        self.queue = queue
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
        admitted: list[Admit | Shed] = []
        while self.waiting and len(self.running) < self.limit:
            nxt, _ = self.waiting.popitem(last=False)
            self.running.add(nxt)
            admitted.append(Admit(nxt))
        return admitted

    def expire(self, ticket: int) -> list[Admit | Shed]:
        """A queued request's wait deadline passed: shed it (nothing if it runs already)."""
        if ticket not in self.waiting:
            return []
        del self.waiting[ticket]
        return [Shed(ticket, "queue_timeout")]


class Overloaded(Exception):
    """The request was shed; `reason` says why (queue full, or waited too long)."""

    def __init__(self, reason: ShedReason, limit: int, queue: int) -> None:
        why = "the wait queue is full" if reason == "queue_full" else "it waited too long for a free slot"
        super().__init__(f"{limit} queries running and {queue} waiting: {why}")
        self.reason = reason


class Gate:
    """An `Admission` on the event loop: a request takes a ticket, waits for its turn at
    most `wait_s`, and gives the ticket back however it ends.

        ticket = gate.ticket()
        try:
            await gate.enter(ticket)    # Overloaded if shed
            ...
        finally:
            gate.leave(ticket)
    """

    def __init__(self, admission: Admission, wait_s: float) -> None:
        self.admission = admission
        self.wait_s = wait_s
        self._tickets = count()
        self._waiters: dict[int, asyncio.Future[None]] = {}

    @property
    def running(self) -> int:
        return len(self.admission.running)

    @property
    def waiting(self) -> int:
        return len(self.admission.waiting)

    def ticket(self) -> int:
        return next(self._tickets)

    async def enter(self, ticket: int) -> None:
        actions = self.admission.arrive(ticket)
        if actions:
            self._raise_if_shed(actions[0])
            return
        waiter = self._waiters[ticket] = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.wait_s)
        except TimeoutError:
            for action in self.admission.expire(ticket):
                self._raise_if_shed(action)
        finally:
            self._waiters.pop(ticket, None)

    def leave(self, ticket: int) -> None:
        for action in self.admission.leave(ticket):
            waiter = self._waiters.get(action.ticket)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def _raise_if_shed(self, action: Admit | Shed) -> None:
        if isinstance(action, Shed):
            raise Overloaded(action.reason, self.admission.limit, self.admission.queue)
