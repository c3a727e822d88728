"""What the llama.cpp worker does next: one chunk of a prefill, or one decode step (pure).

Work is ranked by `(query, class, order)`: the query's arrival, then its first appearance
at the engine (earliest query first, as Teola's topology-aware policy orders queries), then its class
(a partial prefill after the query's other work), then the order it was handed in. A decode
may step with at most `cap` sequences (its caller's choice: every running decode, as
llama.cpp's server does, or the profile's max efficient batch).

- The step: the best-ranked decodes, as many as the smallest cap among them allows;
  a waiting decode joins only if a sequence is free for it.
- A prefill of a whole prompt (the best-ranked begun one, or a waiting one ranked before it
  with a sequence free for it, else the best-ranked waiting one) runs its next chunk instead
  of the step when it ranks before the step's first decode, or when the step has room for
  more decodes (so the decode it prepares can join; for decodes stepped by cost, only where
  a step of one more would pay). Otherwise the step runs.
- A partial prefill (`Work.partial`: a prefix prepared before the rest of its prompt is
  known) only fills time the engine would otherwise idle: taking a turn from a decode or a
  whole prompt would delay work that is ready for work that is not needed yet, and break
  up the steps of the decodes around it.

    plan([Work((0, 3))], [Work((0, 1), cap=1, running=True)], free=2)
    # -> Plan(step=(Work((0, 1), ...),), prefill=None): the decode was handed in first

A caller may instead let the step's size follow the measured cost of a step by sequence
count (`Work.by_cost`, `step_size`): of the ready decodes, the best-ranked k step
together, k chosen for the least mean completion, where that costs nothing beyond stepping
every ready decode together (what a server that batches gets: `extra_seconds` <= 0), else
all of them. That is counted against the step every ready decode and every decode a
waiting prefill prepares would make (`Plan.ready`): holding a later question's prompt back
so an earlier one decodes alone costs what the fuller step would have saved.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

Rank = tuple[float, ...]  # lower first: (query's arrival, first appearance, ..., order handed in)


@dataclass(frozen=True, eq=False)
class Work:
    """A prefill or a decode as the planner sees it; `item` is the worker's own object."""

    rank: Rank
    cap: int = 1  # decodes: the most sequences it may step with
    running: bool = False  # decodes: holds a sequence (else waits for one)
    item: Any = field(default=None, repr=False)
    by_cost: bool = False  # decodes: the step's size follows the step cost (`step_size`)
    joins: bool = False  # prefills: a decode of its query follows (a full prompt, not a partial one)
    partial: bool = False  # prefills: a prefix prepared ahead of its prompt, run only in time the engine would idle


@dataclass(frozen=True)
class Plan:
    step: tuple[Work, ...] = ()  # decodes to advance one token together (waiting ones first take a sequence)
    prefill: Work | None = None  # or the prefill to advance one chunk
    ready: int = 0  # decodes the step could have held: the ready ones, and for a by-cost step those of
    # the prefills that would join it (what stepping everything together after every prefill holds)

    @property
    def idle(self) -> bool:
        return not self.step and self.prefill is None


def plan(
    prefills: Sequence[Work],
    decodes: Sequence[Work],
    free: int,
    begun: Sequence[Work] = (),
    size: Callable[[int, int], int] | None = None,
    may_start: bool = True,
) -> Plan:
    """The next action (see the module doc). `free`: sequences nobody holds (for decodes);
    `begun`: prefills that have evaluated some chunks, each holding a sequence: the best-ranked
    goes on, unless a waiting prefill ranks before it and `may_start` (a sequence is free for
    it), so a later question's prompt that reached the engine first does not keep an earlier
    one waiting for its whole length; `size(n, potential)`: how many of n ready decodes to step,
    for decodes that step `by_cost`, when `potential` decodes would step together if every
    prefill that `joins` ran first."""
    # A partial prefill prepares a prompt whose rest is not known yet: it only fills time the
    # engine would idle, never a turn a decode or a full prompt could use.
    begun_partial = [p for p in begun if p.partial]
    waiting_partial = [p for p in prefills if p.partial]
    prefills = [p for p in prefills if not p.partial]
    begun = [p for p in begun if not p.partial]
    step = _step(decodes, free)
    ready = len(step)
    cap = min((d.cap for d in step), default=0)  # the most the step may hold
    by_cost = size is not None and any(d.by_cost for d in step)
    if by_cost:
        joining = sum(p.joins for p in (*prefills, *begun))
        ready = min(ready + joining, cap)
        step = step[: max(1, min(len(step), size(len(step), ready)))]  # type: ignore[misc]
    prefill = min(begun, key=lambda w: w.rank, default=None)
    waiting = min(prefills, key=lambda w: w.rank, default=None)
    if waiting is not None and (prefill is None or (may_start and waiting.rank < prefill.rank)):
        prefill = waiting
    if prefill is not None:
        # room: the decode the prefill prepares would join the step (by cost: only if that pays)
        room = len(step) < cap
        if by_cost:
            room = room and size(len(step) + 1, ready) > len(step)  # type: ignore[misc]
        if not step or prefill.rank < step[0].rank or room:
            return Plan(prefill=prefill)
    if not step:  # idle otherwise: a partial prefill (one begun goes on; a new one needs a sequence)
        idle_fill = begun_partial or (waiting_partial if may_start else [])
        return Plan(prefill=min(idle_fill, key=lambda w: w.rank)) if idle_fill else Plan()
    return Plan(step=step, ready=ready)


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


def step_size(n: int, cost: Callable[[int], float], slack: float | None = None) -> int:
    """How many of `n` ready decodes (best-ranked first) to step together: the k whose schedule
    "groups of k in rank order, each to the end" (equal lengths) has the least mean completion
    (ties: the larger k, fewer steps). With `slack`, only among the k whose total is within
    `slack` of stepping all n together."""
    if n <= 1:
        return n
    best_k, best_mean = n, _mean_completion(n, n, cost)
    for k in range(n - 1, 0, -1):
        sizes = [k] * (n // k) + ([n % k] if n % k else [])
        if slack is not None and sum(cost(s) for s in sizes) > (1 + slack) * cost(n):
            continue
        mean = _mean_completion(n, k, cost)
        if mean < best_mean - 1e-12:
            best_k, best_mean = k, mean
    return best_k


def costless_step_size(n: int, potential: int, cost: Callable[[int], float]) -> int:
    """How many of `n` ready decodes to step: the mean-latency best k (`step_size`) where that
    costs nothing beyond a step of all `potential` (>= n: the ready decodes and those waiting
    prefills prepare) by `cost`, else all n: never more decode time than always batching."""
    k = step_size(n, cost)
    return k if extra_seconds(k, max(n, potential), cost) <= 0 else n


def extra_seconds(k: int, n: int, cost: Callable[[int], float]) -> float:
    """What stepping k of n ready decodes costs beyond their share of a step of all n (>= 0)."""
    return max(0.0, cost(k) - k * cost(n) / n)


def _mean_completion(n: int, k: int, cost: Callable[[int], float]) -> float:
    done, elapsed, left = 0.0, 0.0, n
    while left > 0:
        group = min(k, left)
        elapsed += cost(group)
        done += group * elapsed
        left -= group
    return done / n


def cost_curve(points: Mapping[int, float]) -> Callable[[int], float]:
    """Step seconds by sequence count from measured points: linear between them, and per
    sequence as at the nearest measured count beyond them."""
    known = sorted((int(k), float(v)) for k, v in points.items() if k >= 1)
    if not known:
        raise ValueError("a cost curve needs at least one measured point")

    def cost(k: int) -> float:
        for (k0, v0), (k1, v1) in pairwise(known):
            if k0 <= k <= k1:
                return v0 + (v1 - v0) * (k - k0) / (k1 - k0)
        edge_k, edge_v = known[0] if k < known[0][0] else known[-1]
        return edge_v * k / edge_k

    return cost
