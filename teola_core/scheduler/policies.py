"""Engine-scheduler batching policies: which pending nodes form the next batch.

A policy owns one engine's queue of pending nodes (`NodeReady` events) and answers one
question, `take(max_items)`: the next batch. Every policy fills a batch the same way
(`fill`), so they differ only in the order they offer candidates:

- the first candidate always runs, even if it alone exceeds `max_items` or is `solo`
  (a stream, or not batchable: it runs alone);
- each further candidate joins if it is not solo and still fits (first fit: one that
  does not fit is passed over, a smaller one behind it may join); the batch closes
  when it holds `max_items` items;
- with a `cost` (the engine's batch latency by items; topology only), the profile
  decides instead of the size: a candidate joins when that lowers the queries' total
  latency. Joining adds `d = cost(T + n) - cost(T)` to the batch (T items, n the
  candidate's) and saves `s = cost(T) + cost(n) - cost(T + n)` of engine time against
  running the candidate next on its own; the saving goes to the candidate's query and
  to the `w` queries waiting behind, the delay to the `m` other queries in the batch:
  join iff `(1 + w) * s >= m * d`. A query's small node rides along with its large
  one (48 chunks + 1 question: 0.03 s more, not 0.10 s later); two queries' mid-size
  nodes share a batch only when others wait (throughput then pays). A cost of `inf`
  past an engine's hard limit keeps batches within it.

Policies, by name (`make_policy`):

    topology  Teola's default, the paper's Algorithm 2: bucket the pending nodes by
              query; order buckets by the query's arrival (earliest first); within a
              bucket offer the node with the greatest depth (longest path to the
              output) first, ties in queue order; fill up to the max efficient batch.
    fifo      queue order; fill up to the max batch.
    po        per-invocation, latency first: the oldest pending node and every other
              pending node of the same invocation (same query and module) form one
              batch, whatever its size; each engine instance runs one invocation at
              a time (static batching, no mixing across invocations).
    to        throughput first: FIFO filled up to a fixed max batch (`max_batch=`;
              without it, the engine scheduler's max batch).

    >>> p = make_policy("fifo")
    >>> for e in events: p.push(e)
    >>> batch = p.take(max_items=16)
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from itertools import count
from typing import ClassVar

from teola_core.scheduler.events import NodeReady

BatchCost = Callable[[int], float]
"""An engine's batch latency (seconds) by the items in the batch."""


def fill(
    candidates: Iterable[NodeReady], max_items: int | None, cost: BatchCost | None = None, waiting: int = 0
) -> list[NodeReady]:
    """Pick a batch from candidates in policy order (see the module docstring).

    With `cost`, `max_items` is not used and candidates must come grouped by query, most
    advancing first (as topology offers them); `waiting` is how many queries have
    pending nodes. A query whose first offered node does not join adds none of its
    others (they would finish early only to wait for that one: they ride along with it
    later). Once a new query's node of one item could not join, no later one can.
    """
    if cost is None:
        return _fill_by_size(candidates, max_items)
    batch: list[NodeReady] = []
    total = 0
    queries: set[str] = set()
    passed: set[str] = set()  # queries whose most advancing node did not join: the rest waits for it
    for c in candidates:
        if c.query_id in passed:
            continue
        alone = bool(batch) and (c.solo or batch[0].solo)
        if not batch or (not alone and _joins(c.items, c.query_id, total, queries, waiting, cost)):
            batch.append(c)
            total += c.items
            queries.add(c.query_id)
            if c.solo:
                break
        elif c.query_id not in queries:
            if not _joins(1, c.query_id, total, queries, waiting, cost):
                break  # no node of a query not yet in the batch can join any more
            passed.add(c.query_id)
    return batch


def _fill_by_size(candidates: Iterable[NodeReady], max_items: int | None) -> list[NodeReady]:
    batch: list[NodeReady] = []
    total = 0
    for c in candidates:
        if not batch:
            batch.append(c)
            total = c.items
            if c.solo or (max_items is not None and total >= max_items):
                break
        elif not c.solo and (max_items is None or total + c.items <= max_items):
            batch.append(c)
            total += c.items
            if max_items is not None and total >= max_items:
                break
    return batch


def _joins(items: int, query: str, total: int, queries: set[str], waiting: int, cost: BatchCost) -> bool:
    """`(1 + w) * s >= m * d` (see the module docstring)."""
    together = cost(total + items)
    added = together - cost(total)
    saved = cost(total) + cost(items) - together
    others = len(queries - {query})
    behind = max(0, waiting - len(queries | {query}))
    return (1 + behind) * saved >= others * added


class Policy(ABC):
    """One engine's pending queue and its batching order."""

    name: ClassVar[str] = "policy"

    @abstractmethod
    def push(self, ready: NodeReady) -> None:
        """Queue a node."""

    @abstractmethod
    def take(self, max_items: int | None, cost: BatchCost | None = None) -> list[NodeReady]:
        """Remove and return the next batch (empty only when nothing is pending).

        `cost`: the engine's batch latency by items, for policies that weigh it (topology).
        """

    @abstractmethod
    def drop_query(self, query_id: str) -> list[NodeReady]:
        """Remove and return every pending node of a query."""

    @abstractmethod
    def __len__(self) -> int:
        """How many nodes are pending."""

    def limit(self, max_items: int | None) -> int | None:
        """The max batch this policy fills to, given the engine scheduler's."""
        return max_items

    def slots(self, concurrency: int, instances: int) -> int:
        """Batches that may run at once, given the engine's limits."""
        return concurrency


class FifoPolicy(Policy):
    """Queue order. An insertion-ordered dict keeps removal O(1) when a query drops."""

    name = "fifo"

    def __init__(self) -> None:
        self._seq = count()
        self._queue: dict[int, NodeReady] = {}
        self._by_query: dict[str, dict[int, None]] = {}

    def push(self, ready: NodeReady) -> None:
        seq = next(self._seq)
        self._queue[seq] = ready
        self._by_query.setdefault(ready.query_id, {})[seq] = None

    def take(self, max_items: int | None, cost: BatchCost | None = None) -> list[NodeReady]:
        chosen: list[int] = []  # FIFO fills by size only (the paper's baselines): `cost` is not used

        def offered() -> Iterator[NodeReady]:
            for seq, ready in self._queue.items():
                chosen.append(seq)
                yield ready

        batch = fill(offered(), max_items)
        picked = {id(r) for r in batch}
        for seq in chosen:
            ready = self._queue[seq]
            if id(ready) in picked:
                del self._queue[seq]
                mine = self._by_query[ready.query_id]
                del mine[seq]
                if not mine:
                    del self._by_query[ready.query_id]
        return batch

    def drop_query(self, query_id: str) -> list[NodeReady]:
        return [self._queue.pop(seq) for seq in self._by_query.pop(query_id, {})]

    def __len__(self) -> int:
        return len(self._queue)


class PerInvocationPolicy(FifoPolicy):
    """PO: one invocation per batch, one batch per engine instance (latency first).

    An invocation is what a module-by-module framework sends an engine in one go: the
    ready nodes of one query's module. The batch is the whole invocation (the engine
    runs it alone, so it is as fast as it can be), and nothing of other invocations
    joins it: there is no dynamic batching across queries.
    """

    name = "po"

    def take(self, max_items: int | None, cost: BatchCost | None = None) -> list[NodeReady]:
        if not self._queue:
            return []
        first_seq, first = next(iter(self._queue.items()))
        if first.solo:
            chosen = [first_seq]
        else:
            module = first.node.module
            chosen = [
                seq
                for seq in self._by_query[first.query_id]
                if not self._queue[seq].solo and self._queue[seq].node.module == module
            ]
        batch = [self._queue.pop(seq) for seq in chosen]
        mine = self._by_query[first.query_id]
        for seq in chosen:
            del mine[seq]
        if not mine:
            del self._by_query[first.query_id]
        return batch

    def slots(self, concurrency: int, instances: int) -> int:
        return instances


class ThroughputPolicy(FifoPolicy):
    """TO: FIFO filled up to a fixed max batch (throughput first)."""

    name = "to"

    def __init__(self, max_batch: int | None = None) -> None:
        super().__init__()
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"policy 'to': max_batch must be at least 1, got {max_batch}")
        self.max_batch = max_batch

    def limit(self, max_items: int | None) -> int | None:
        return self.max_batch if self.max_batch is not None else max_items


class TopologyPolicy(Policy):
    """Topology-aware batching (paper Algorithm 2): queries by arrival, deepest node first.

    Buckets: query id -> its pending nodes sorted by (-depth, queue order). Bucket order:
    sorted (arrival, first-seen order, query id) keys. Push and drop are O(log n) searches
    plus list inserts; `take` visits candidates only until the batch is full.
    """

    name = "topology"

    def __init__(self) -> None:
        self._seq = count()
        self._buckets: dict[str, list[tuple[float, int, NodeReady]]] = {}
        self._order: list[tuple[float, int, str]] = []
        self._keys: dict[str, tuple[float, int, str]] = {}
        self._len = 0

    def push(self, ready: NodeReady) -> None:
        seq = next(self._seq)
        bucket = self._buckets.get(ready.query_id)
        if bucket is None:
            bucket = self._buckets[ready.query_id] = []
            key = (ready.arrival, seq, ready.query_id)
            self._keys[ready.query_id] = key
            bisect.insort(self._order, key)
        bisect.insort(bucket, (-ready.depth, seq, ready))
        self._len += 1

    def take(self, max_items: int | None, cost: BatchCost | None = None) -> list[NodeReady]:
        def offered() -> Iterator[NodeReady]:
            for _, _, query_id in self._order:
                for _, _, ready in self._buckets[query_id]:
                    yield ready

        batch = fill(offered(), max_items, cost, waiting=len(self._buckets))
        picked = {id(r) for r in batch}
        for query_id in dict.fromkeys(r.query_id for r in batch):
            bucket = self._buckets[query_id]
            bucket[:] = [entry for entry in bucket if id(entry[2]) not in picked]
            if not bucket:
                self._remove_bucket(query_id)
        self._len -= len(batch)
        return batch

    def drop_query(self, query_id: str) -> list[NodeReady]:
        bucket = self._buckets.get(query_id)
        if bucket is None:
            return []
        self._remove_bucket(query_id)
        self._len -= len(bucket)
        return [entry[2] for entry in bucket]

    def _remove_bucket(self, query_id: str) -> None:
        del self._buckets[query_id]
        key = self._keys.pop(query_id)
        del self._order[bisect.bisect_left(self._order, key)]

    def __len__(self) -> int:
        return self._len


POLICIES: dict[str, type[Policy]] = {
    p.name: p for p in (TopologyPolicy, FifoPolicy, PerInvocationPolicy, ThroughputPolicy)
}


def make_policy(name: str, *, max_batch: int | None = None) -> Policy:
    """A fresh policy (it holds one engine's queue). `max_batch` configures "to" only."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown scheduling policy {name!r} (known: {', '.join(POLICIES)})") from None
    if cls is ThroughputPolicy:
        return ThroughputPolicy(max_batch)
    if max_batch is not None:
        raise ValueError(f"policy {name!r} takes no max_batch; only 'to' has a fixed max batch")
    return cls()
