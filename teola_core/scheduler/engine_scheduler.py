"""The engine scheduler: one per engine, turns pending nodes into batches and owns its slots.

A pure state machine like the graph scheduler: `handle(*events) -> [RunBatch | CancelBatch]`,
no I/O, no clock. Several events may be handed in at once (as Dask's
`handle_stimulus(*stims)`): all are applied before any batch is formed, so nodes that
became ready together can share a batch.

State:

    pending    the policy's queue of `NodeReady` events (see `policies`)
    running    batch id -> the `RunBatch` in flight and the queries that still need it
    slots      batches that may be in flight at once: `concurrency`
               (EngineLimits.concurrency), or what the policy allows (po: one
               invocation per engine instance); a running batch holds one until its
               `BatchFinished`, whatever ended it
    max batch  the most items a batch carries: the engine's max efficient batch (a node
               larger than it runs alone); the policy may narrow it (po: 1, to: fixed)
    batch cost the engine's batch latency by items (optional): topology lets a node
               past the max batch ride along when it is cheap there (see `policies`)
    spare      speculative nodes (`teola_core.ir.speculation`), by arrival: one starts,
               alone, only when the engine runs nothing and the policy holds nothing,
               so they take only time the engine would idle

Transitions: `NodeReady` queues a node (a speculative one in spare); `BatchFinished`
frees its slot; `WithdrawRequested` drops a spare node not yet started (`Withdrawn`);
`QueryCancelRequested` (the query failed or was cancelled) drops the query's pending
nodes, and every running batch that no other live query needs gets a `CancelBatch`.
After every call, while a slot is free and nodes are pending, the policy picks the next
batch and a `RunBatch` goes out.

    es = EngineScheduler("embedder", policy="topology", max_batch_items=16, concurrency=1)
    [run] = es.handle(NodeReady(...), NodeReady(...))   # one batch of both
    es.handle(QueryCancelRequested(query_id=..., now=t))  # [CancelBatch(...)] if only it needed run
    es.handle(BatchFinished(batch_id=run.batch_id, now=t))
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from itertools import count

from teola_core.engines.protocol import Engine, EngineSet
from teola_core.ir.speculation import speculation_of
from teola_core.scheduler.events import (
    BatchFinished,
    CancelBatch,
    ConcurrencyChanged,
    EngineAction,
    EngineEvent,
    NodeReady,
    QueryCancelRequested,
    RunBatch,
    SchedulerError,
    Withdrawn,
    WithdrawRequested,
)
from teola_core.scheduler.policies import BatchCost, Policy, make_policy
from teola_core.scheduler.sizing import batch_cost as batch_cost_of
from teola_core.scheduler.sizing import max_batch as max_batch_of


class _Running:
    """A batch in flight: the queries that still need its results."""

    __slots__ = ("batch", "cancelled", "needed_by")

    def __init__(self, batch: RunBatch) -> None:
        self.batch = batch
        self.needed_by = {c.query_id for c in batch.calls}
        self.cancelled = False


class EngineScheduler:
    def __init__(
        self,
        engine: str,
        *,
        policy: str | Policy = "topology",
        max_batch_items: int | None = None,
        concurrency: int = 1,
        instances: int = 1,
        batch_cost: BatchCost | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"engine {engine!r}: concurrency must be at least 1, got {concurrency}")
        if max_batch_items is not None and max_batch_items < 1:
            raise ValueError(f"engine {engine!r}: max_batch_items must be at least 1, got {max_batch_items}")
        self.engine = engine
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self.max_batch_items = max_batch_items
        self.batch_cost = batch_cost
        self.instances = instances
        self.concurrency = self.policy.slots(concurrency, instances)
        self._running: dict[int, _Running] = {}
        self._by_query: dict[str, set[int]] = {}  # query -> running batches holding its calls
        self._ids = count()
        self._spare: list[tuple[float, int, NodeReady]] = []  # (arrival, seq, node), sorted
        self._spare_seq = count()

    @classmethod
    def for_engine(
        cls,
        name: str,
        engine: Engine,
        *,
        policy: str = "topology",
        to_max_batch: int | None = None,
        max_batch: Mapping[str, int | None] | None = None,
    ) -> EngineScheduler:
        """The scheduler of `engine` under `policy`, its max batch from its profile and limits,
        or from `max_batch[name]` when given there (see `sizing`)."""
        overrides = max_batch or {}
        return cls(
            name,
            policy=make_policy(policy, max_batch=to_max_batch if policy == "to" else None),
            max_batch_items=(limit := max_batch_of(engine, overrides.get(name), overridden=name in overrides)),
            concurrency=engine.limits.concurrency,
            instances=engine.limits.instances,
            batch_cost=batch_cost_of(engine, limit if name in overrides else engine.limits.max_batch_items),
        )

    @classmethod
    def for_engines(
        cls,
        engines: EngineSet,
        *,
        policy: str = "topology",
        to_max_batch: int | None = None,
        max_batch: Mapping[str, int | None] | None = None,
    ) -> dict[str, EngineScheduler]:
        """One scheduler per engine of the set, by name (`for_engine`); `max_batch` may name
        only engines of the set."""
        overrides = dict(max_batch or {})
        unknown = set(overrides) - set(engines.engines)
        if unknown:
            raise ValueError(f"max_batch names unknown engine(s) {sorted(unknown)}")
        return {
            name: cls.for_engine(name, engine, policy=policy, to_max_batch=to_max_batch, max_batch=overrides)
            for name, engine in engines.engines.items()
        }

    @property
    def pending(self) -> int:
        """Nodes waiting for the engine (speculative ones not counted: they wait for idle time)."""
        return len(self.policy)

    @property
    def spare(self) -> int:
        """Speculative nodes waiting for idle engine time."""
        return len(self._spare)

    @property
    def running(self) -> tuple[RunBatch, ...]:
        return tuple(r.batch for r in self._running.values())

    def handle(self, *events: EngineEvent) -> list[EngineAction]:
        """Apply the events, then start batches while slots are free."""
        actions: list[EngineAction] = []
        for event in events:
            if isinstance(event, NodeReady):
                if speculation_of(event.node) is None:
                    self.policy.push(event)
                else:
                    bisect.insort(self._spare, (event.arrival, next(self._spare_seq), event))
            elif isinstance(event, BatchFinished):
                self._finished(event.batch_id)
            elif isinstance(event, WithdrawRequested):
                actions.extend(self._withdraw(event.query_id, event.node_id))
            elif isinstance(event, QueryCancelRequested):
                self.policy.drop_query(event.query_id)
                self._spare = [entry for entry in self._spare if entry[2].query_id != event.query_id]
                actions.extend(self._forget(event.query_id))
            elif isinstance(event, ConcurrencyChanged):
                if event.concurrency < 1:
                    raise SchedulerError(f"engine {self.engine!r}: concurrency must be >= 1, got {event.concurrency}")
                self.concurrency = self.policy.slots(event.concurrency, self.instances)
            else:
                raise SchedulerError(f"engine scheduler cannot handle {type(event).__name__}")
        limit = self.policy.limit(self.max_batch_items)
        while len(self._running) < self.concurrency and len(self.policy):
            actions.append(self._run(self.policy.take(limit, self.batch_cost)))
        if not self._running and not len(self.policy) and self._spare:
            actions.append(self._run([self._spare.pop(0)[2]]))
        return actions

    def _run(self, batch: list[NodeReady]) -> RunBatch:
        run = RunBatch(
            engine=self.engine,
            batch_id=next(self._ids),
            calls=tuple(r.call() for r in batch),
            stream=batch[0].stream,
        )
        running = self._running[run.batch_id] = _Running(run)
        for query_id in running.needed_by:
            self._by_query.setdefault(query_id, set()).add(run.batch_id)
        return run

    def _withdraw(self, query_id: str, node_id: str) -> list[Withdrawn]:
        """Drop the query's spare node if it has not started; nothing if it has."""
        for i, (_, _, ready) in enumerate(self._spare):
            if ready.query_id == query_id and ready.node.id == node_id:
                del self._spare[i]
                return [Withdrawn(query_id=query_id, node=ready.node)]
        return []

    def _finished(self, batch_id: int) -> None:
        running = self._running.pop(batch_id, None)
        if running is None:
            raise SchedulerError(f"engine {self.engine!r}: batch {batch_id} is not running")
        for query_id in running.needed_by:
            mine = self._by_query[query_id]
            mine.discard(batch_id)
            if not mine:
                del self._by_query[query_id]

    def _forget(self, query_id: str) -> list[CancelBatch]:
        """The query ended: cancel each of its running batches that no other live query needs."""
        cancels = []
        for batch_id in sorted(self._by_query.pop(query_id, ())):
            running = self._running[batch_id]
            running.needed_by.discard(query_id)
            if not running.needed_by and not running.cancelled:
                running.cancelled = True
                cancels.append(CancelBatch(engine=self.engine, batch_id=batch_id))
        return cancels
