"""The engine scheduler: one per engine, turns pending nodes into batches.

A pure state machine like the graph scheduler: `handle(*events) -> [RunBatch]`, no I/O,
no clock. Several events may be handed in at once (as Dask's `handle_stimulus(*stims)`):
all are applied before any batch is formed, so nodes that became ready together can
share a batch.

State:

    pending    the policy's queue of `NodeReady` events (see `policies`)
    running    batch id -> the `RunBatch` in flight
    slots      batches that may be in flight at once: `concurrency`
               (EngineLimits.concurrency), or what the policy allows (po: one
               invocation per engine instance)
    max batch  the most items a batch carries: the engine's max efficient batch (a node
               larger than it runs alone); the policy may narrow it (po: 1, to: fixed)
    batch cost the engine's batch latency by items (optional): topology lets a node
               past the max batch ride along when it is cheap there (see `policies`)

Transitions: `NodeReady` queues a node; `BatchFinished` frees its slot;
`QueryCancelRequested` drops the query's pending nodes (a batch already running is the
runtime's business). After every call, while a slot is free and nodes are pending, the
policy picks the next batch and a `RunBatch` goes out.

    es = EngineScheduler("embedder", policy="topology", max_batch_items=16, concurrency=1)
    [run] = es.handle(NodeReady(...), NodeReady(...))   # one batch of both
    es.handle(BatchFinished(batch_id=run.batch_id, now=t))
"""

from __future__ import annotations

from itertools import count

from teola_core.scheduler.events import (
    BatchFinished,
    EngineEvent,
    NodeReady,
    QueryCancelRequested,
    RunBatch,
    SchedulerError,
)
from teola_core.scheduler.policies import BatchCost, Policy, make_policy


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
        self.concurrency = self.policy.slots(concurrency, instances)
        self._running: dict[int, RunBatch] = {}
        self._ids = count()

    @property
    def pending(self) -> int:
        return len(self.policy)

    @property
    def running(self) -> tuple[RunBatch, ...]:
        return tuple(self._running.values())

    def handle(self, *events: EngineEvent) -> list[RunBatch]:
        """Apply the events, then start batches while slots are free."""
        for event in events:
            if isinstance(event, NodeReady):
                self.policy.push(event)
            elif isinstance(event, BatchFinished):
                if self._running.pop(event.batch_id, None) is None:
                    raise SchedulerError(f"engine {self.engine!r}: batch {event.batch_id} is not running")
            elif isinstance(event, QueryCancelRequested):
                self.policy.drop_query(event.query_id)
            else:
                raise SchedulerError(f"engine scheduler cannot handle {type(event).__name__}")
        actions: list[RunBatch] = []
        limit = self.policy.limit(self.max_batch_items)
        while len(self._running) < self.concurrency and len(self.policy):
            batch = self.policy.take(limit, self.batch_cost)
            run = RunBatch(
                engine=self.engine,
                batch_id=next(self._ids),
                calls=tuple(r.call() for r in batch),
                stream=batch[0].stream,
            )
            self._running[run.batch_id] = run
            actions.append(run)
        return actions
