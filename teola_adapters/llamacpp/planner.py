"""What the llama.cpp worker does next: one chunk of a prefill, or one decode step (pure).

Work is ranked by `(query, class, order)`: the query's first appearance at the engine
(earliest query first, as Teola's topology-aware policy orders queries), then its class
(a partial prefill, work that only fills idle time, after the query's other work), then
the order it was handed in. A decode may step with at most `cap` sequences (its caller's choice: every
running decode, as llama.cpp's server does, or the profile's max efficient batch).

- The step: the best-ranked decodes, as many as the smallest cap among them allows;
  a waiting decode joins only if a sequence is free for it.
- A prefill (the one begun, else the best-ranked) runs its next chunk instead of the step
  when it ranks before the step's first decode, or when the step has room for more
  decodes (so the decode it prepares can join). Otherwise the step runs.

    plan([Work((0, 3))], [Work((0, 1), cap=1, running=True)], free=2)
    # -> Plan(step=(Work((0, 1), ...),), prefill=None): the decode was handed in first
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

Rank = tuple[int, ...]  # lower first: (query's first appearance, ..., order handed in)


@dataclass(frozen=True, eq=False)
class Work:
    """A prefill or a decode as the planner sees it; `item` is the worker's own object."""

    rank: Rank
    cap: int = 1  # decodes: the most sequences it may step with
    running: bool = False  # decodes: holds a sequence (else waits for one)
    item: Any = field(default=None, repr=False)


@dataclass(frozen=True)
class Plan:
    step: tuple[Work, ...] = ()  # decodes to advance one token together (waiting ones first take a sequence)
    prefill: Work | None = None  # or the prefill to advance one chunk

    @property
    def idle(self) -> bool:
        return not self.step and self.prefill is None


def plan(prefills: Sequence[Work], decodes: Sequence[Work], free: int, begun: Work | None = None) -> Plan:
    """The next action (see the module doc). `free`: sequences nobody holds; `begun`: the
    prefill that has evaluated some chunks and holds a sequence (it runs before other prefills)."""
    step = _step(decodes, free)
    prefill = begun if begun is not None else min(prefills, key=lambda w: w.rank, default=None)
    if prefill is not None:
        room = bool(step) and len(step) < min(d.cap for d in step)
        if not step or prefill.rank < step[0].rank or room:
            return Plan(prefill=prefill)
    return Plan(step=step)


def _step(decodes: Sequence[Work], free: int) -> tuple[Work, ...]:
    chosen: list[Work] = []
    cap: int | None = None  # the smallest cap among the chosen
    for decode in sorted(decodes, key=lambda w: w.rank):
        if cap is not None and len(chosen) >= cap:
            break
        limit = decode.cap if cap is None else min(cap, decode.cap)
        if len(chosen) >= limit:
            continue  # it would shrink the step below what is chosen
        if not decode.running:
            if free == 0:
                continue
            free -= 1
        chosen.append(decode)
        cap = limit
    return tuple(chosen)
