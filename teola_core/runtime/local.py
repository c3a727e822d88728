"""The local runtime: asyncio, in-process, the default backend. It does the I/O for three
pure state machines (`teola_core.scheduler`): the graph scheduler, one engine scheduler
per engine (batches, slots) and the stream groups (partial decodes); all it learns goes
back to them as events. Nothing polls or sleeps.

    runtime = LocalRuntime(EngineSet().add(embedder).add(llm), timeouts=Timeouts(step_s=30))
    answer = await runtime.run(graph, {"question": "..."})   # many at once, from many tasks
    await runtime.close()

Engine events are handed to the engine schedulers once per loop turn (nodes that became
ready together share a batch). A batch runs in a task whose done callback reports its
end however it ended (even cancelled before its first step), so no slot ever leaks. A
failed or cancelled query is told to every engine scheduler at once: batches only it
needed are cancelled. A primitive's exception fails its query only; a failed batch gives
each call its own copy; a deadline names the step (`step_outcomes`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import count
from typing import Any

from teola_core.engines.protocol import EngineSet
from teola_core.ir.errors import QueryCancelled
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import Placement, PrimitiveKind, spec_of
from teola_core.ir.node import Node
from teola_core.runtime.base import PrimitiveSpan, Runtime, RuntimeHook, notify
from teola_core.runtime.step_outcomes import (
    Outcome,
    engine_batch_outcomes,
    engine_stream_outcome,
    inline_outcome,
    user_step_outcome,
)
from teola_core.runtime.timeouts import Timeouts
from teola_core.scheduler import streams as sg
from teola_core.scheduler.engine_scheduler import EngineScheduler
from teola_core.scheduler.events import (
    BatchFinished,
    CancelBatch,
    CancelNodes,
    ConcurrencyChanged,
    Dispatch,
    EngineEvent,
    GraphAction,
    GraphEvent,
    NodeFailed,
    NodeFinished,
    NodeReady,
    NodeStarted,
    NodeWithdrawn,
    QueryCancelRequested,
    QueryDone,
    QueryFailed,
    QuerySubmitted,
    RunBatch,
    Withdrawn,
    WithdrawNode,
    WithdrawRequested,
)
from teola_core.scheduler.graph_scheduler import GraphScheduler

_PLACEMENT = {kind: spec_of(kind).placement for kind in PrimitiveKind}


@dataclass(slots=True, eq=False)
class _QueryRun:
    """The runtime's side of one running query."""

    future: asyncio.Future[dict[str, Any]]
    context: Any = None  # handed to engines on each of the query's calls (`Call.context`)
    ready_at: dict[str, float] = field(default_factory=dict)  # node id -> when dispatched
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)  # user nodes running


class LocalRuntime(Runtime):
    """Runs queries in-process on one asyncio loop; all queries share the engine schedulers.

    engines: the engines by name. policy: "topology" (default), "fifo", "po" or "to"
    (see `teola_core.scheduler.policies`). max_batch: per-engine max batch in items,
    overriding the profile's (None in the mapping: unbounded; always capped by the engine's
    `max_batch_items`). depth_cost: weight of a node in the depth used for topology-aware
    batching (default: 1 per node). to_max_batch: the fixed max batch of the "to" policy.
    timeouts: deadlines of engine batches and user steps (`Timeouts`; may be replaced
    later through the `timeouts` attribute). clock: a monotonic clock for events and spans.
    """

    def __init__(
        self,
        engines: EngineSet,
        policy: str = "topology",
        *,
        max_batch: Mapping[str, int | None] | None = None,
        depth_cost: Callable[[Node], float] | None = None,
        to_max_batch: int | None = None,
        timeouts: Timeouts | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._schedulers = EngineScheduler.for_engines(
            engines, policy=policy, to_max_batch=to_max_batch, max_batch=max_batch
        )
        self._engines = engines
        self.timeouts = timeouts or Timeouts()
        self._clock = clock
        self._graph = GraphScheduler(depth_cost)
        self._streams = sg.StreamGroups()
        self._queries: dict[str, _QueryRun] = {}
        self._batches: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._hooks: list[RuntimeHook] = []
        self._ids = count()
        self._queue: deque[GraphEvent] = deque()
        self._draining = False
        self._inbox: dict[str, list[EngineEvent]] = {}
        self._flush_handle: asyncio.Handle | None = None
        self._idle = asyncio.Event()  # no batch in flight, every batch's end heard
        self._idle.set()
        self._closed = False
        self._watchers: dict[str, list[Callable[[int, int], None]]] = {}
        self._closing: list[Callable[[], Awaitable[None]]] = []
        for name, engine in engines.engines.items():
            if engine.load_watch is not None:
                engine.load_watch.attach(self, name)

    # -- public ----------------------------------------------------------------------------
    def add_hook(self, hook: RuntimeHook) -> None:
        self._hooks.append(hook)

    def now(self) -> float:
        """The runtime's clock (the one `arrival` and spans are measured on)."""
        return self._clock()

    def scheduler(self, engine: str) -> EngineScheduler:
        """The engine scheduler of `engine` (for inspection)."""
        return self._schedulers[engine]

    def watch_engine(self, engine: str, watcher: Callable[[int, int], None]) -> None:
        """Call `watcher(batches running, nodes pending)` after each change to `engine`'s queue."""
        if engine not in self._schedulers:
            raise KeyError(f"no engine {engine!r} in this runtime")
        self._watchers.setdefault(engine, []).append(watcher)

    def on_close(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Await `callback()` when the runtime closes (what an engine's load watch opened)."""
        self._closing.append(callback)

    def set_concurrency(self, engine: str, concurrency: int) -> None:
        """Let `engine` run `concurrency` batches at once from now on (more start if slots opened)."""
        if engine not in self._schedulers:
            raise KeyError(f"no engine {engine!r} in this runtime")
        if concurrency < 1:
            raise ValueError(f"engine {engine!r}: concurrency must be at least 1, got {concurrency}")
        self._to_engine(engine, ConcurrencyChanged(concurrency=concurrency))

    @property
    def slots_held(self) -> int:
        """Engine slots held by batches in flight, over all engines."""
        return sum(len(s.running) for s in self._schedulers.values())

    async def idle(self) -> None:
        """Wait until no engine batch is in flight and every slot is back (`slots_held == 0`)."""
        await self._idle.wait()

    async def run(
        self,
        graph: Graph,
        inputs: Mapping[str, Any],
        *,
        query_id: str | None = None,
        arrival: float | None = None,
        context: Any = None,
    ) -> dict[str, Any]:
        if self._closed:
            raise RuntimeError("this LocalRuntime is closed")
        qid = query_id if query_id is not None else f"q{next(self._ids)}"
        if qid in self._queries:
            raise ValueError(f"query id {qid!r} is already running")
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        run = self._queries[qid] = _QueryRun(future, context)
        self._feed(QuerySubmitted(query_id=qid, graph=graph, inputs=inputs, now=self._clock(), arrival=arrival))
        try:
            return await future
        except asyncio.CancelledError:
            if self._queries.get(qid) is run:
                self._abort(qid, asyncio.CancelledError())
            raise

    async def close(self) -> None:
        """Fail the queries still running (`QueryCancelled`) and cancel every background task.

        The engines are not closed: their owner (who built the `EngineSet`) closes them.
        """
        self._closed = True
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        for qid in list(self._queries):
            self._abort(qid, QueryCancelled(f"query {qid}: the runtime was closed"))
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        self._flush()  # the batches' ends, reported by their done callbacks
        results += await asyncio.gather(*(callback() for callback in self._closing), return_exceptions=True)
        errors = [r for r in results if isinstance(r, Exception)]
        if errors:
            raise errors[0]

    # -- graph events ----------------------------------------------------------------------
    def _feed(self, *events: GraphEvent) -> None:
        """Run graph events to quiescence; inline results feed back into the same loop."""
        self._queue.extend(events)
        if self._draining:
            return
        self._draining = True
        try:
            while self._queue:
                self._step(self._queue.popleft())
        finally:
            self._draining = False

    def _step(self, event: GraphEvent) -> None:
        try:
            actions = self._graph.handle(event)
        except Exception as exc:  # a scheduler or runtime bug: fail the query, do not hang it
            self._abort(event.query_id, exc)
            return
        for action in actions:
            try:
                self._apply(action)
            except Exception as exc:
                self._abort(action.query_id, exc)

    def _apply(self, action: GraphAction) -> None:
        if isinstance(action, Dispatch):
            self._dispatch(action)
        elif isinstance(action, QueryDone):
            self._finish(action.query_id, result=action.outputs)
        elif isinstance(action, QueryFailed):
            self._finish(action.query_id, error=action.error)
        elif isinstance(action, CancelNodes):
            tasks = self._queries[action.query_id].tasks if action.query_id in self._queries else {}
            for node_id in action.node_ids:
                if node_id in tasks:
                    tasks.pop(node_id).cancel()
        elif isinstance(action, WithdrawNode):
            assert action.node.engine is not None  # only engine work is speculative (validated)
            withdraw = WithdrawRequested(query_id=action.query_id, node_id=action.node.id, now=self._clock())
            self._to_engine(action.node.engine, withdraw)
        else:
            raise TypeError(f"unknown graph action {action!r}")

    def _dispatch(self, d: Dispatch) -> None:
        run = self._queries[d.query_id]
        node = d.node
        now = run.ready_at[node.id] = self._clock()
        placement = _PLACEMENT[node.kind]
        if placement is Placement.INLINE:
            self._done(d.query_id, node, now, now, inline_outcome(node, d.inputs))
        elif placement is Placement.USER:
            self._spawn(self._run_user(d.query_id, run, node, d.inputs), run, node.id)
        elif node.engine not in self._schedulers:
            error = KeyError(f"no engine named {node.engine!r} (registered: {', '.join(sorted(self._schedulers))})")
            self._queue.append(NodeFailed(query_id=d.query_id, node_id=node.id, error=error, now=now))
        elif node.kind is PrimitiveKind.PARTIAL_DECODE:
            for action in self._streams.handle(sg.PartDispatched(query_id=d.query_id, node=node, now=now)):
                if isinstance(action, sg.StartStream):
                    self._to_engine(node.engine, NodeReady.from_dispatch(d, now, stream=True))
                else:
                    self._part_settled(action)
        else:
            self._to_engine(node.engine, NodeReady.from_dispatch(d, now))

    def _done(self, qid: str, node: Node, started: float, ended: float, result: Outcome, n: int = 1) -> None:
        """A dispatched node settled (`n`: the size of its batch): its span, and its event."""
        run = self._queries.get(qid)
        ready = run.ready_at.pop(node.id, started) if run is not None else started
        error = result if isinstance(result, BaseException) else None
        if self._hooks:
            why = None if error is None else f"{type(error).__name__}: {error}"
            notify(self._hooks, PrimitiveSpan(qid, node, ready, max(started, ready), ended, n, why))
        if error is not None:
            self._queue.append(NodeFailed(query_id=qid, node_id=node.id, error=error, now=ended))
        else:
            self._queue.append(NodeFinished(query_id=qid, node_id=node.id, outputs=result, now=ended))  # type: ignore[arg-type]

    def _finish(self, qid: str, *, result: dict[str, Any] | None = None, error: BaseException | None = None) -> None:
        """The query ended: resolve its future; if it failed, stop what it still has running."""
        run = self._queries.pop(qid, None)
        if run is None:
            return
        if not run.future.done():
            if error is not None:
                run.future.set_exception(error)
            else:
                run.future.set_result(result if result is not None else {})
        self._streams.handle(sg.QueryEnded(query_id=qid))
        if result is not None:
            return  # every node settled: nothing of it is queued or running
        for task in run.tasks.values():
            task.cancel()
        now = self._clock()
        for name in self._schedulers:  # at once: a batch started this turn is cancelled this turn
            self._engine_handle(name, QueryCancelRequested(query_id=qid, now=now))

    def _abort(self, qid: str, error: BaseException) -> None:
        """Fail a query with `error` (the caller cancelled, the runtime closes, or a bug)."""
        if qid not in self._queries:
            return
        if qid in self._graph:
            try:
                self._graph.handle(QueryCancelRequested(query_id=qid, now=self._clock()))
            except Exception as exc:
                error.add_note(f"while failing query {qid}, the graph scheduler raised {exc!r}")
        self._finish(qid, error=error)

    # -- engines ---------------------------------------------------------------------------
    def _to_engine(self, engine: str, event: EngineEvent) -> None:
        self._inbox.setdefault(engine, []).append(event)
        if self._flush_handle is None and not self._closed:
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Hand each engine scheduler its inbox at once (nodes of ended queries left out)."""
        self._flush_handle = None
        inbox, self._inbox = self._inbox, {}
        for name, events in inbox.items():
            live = [e for e in events if not isinstance(e, NodeReady) or e.query_id in self._queries]
            self._engine_handle(name, *live)
        if not self._batches and self.slots_held == 0:
            self._idle.set()

    def _engine_handle(self, name: str, *events: EngineEvent) -> None:
        self._engine_step(name, *events)
        scheduler = self._schedulers[name]
        for watcher in self._watchers.get(name, ()):
            watcher(len(scheduler.running), scheduler.pending)

    def _engine_step(self, name: str, *events: EngineEvent) -> None:
        try:
            actions = self._schedulers[name].handle(*events)
        except Exception as exc:  # a scheduler bug: fail the queries it concerned
            for event in events:
                if isinstance(event, NodeReady):
                    self._abort(event.query_id, exc)
            return
        for action in actions:
            if isinstance(action, CancelBatch):
                task = self._batches.get((name, action.batch_id))
                if task is not None:
                    task.cancel()
            elif isinstance(action, Withdrawn):  # never ran: no span, its outputs from its speculation
                run = self._queries.get(action.query_id)
                if run is not None:
                    run.ready_at.pop(action.node.id, None)
                    self._feed(NodeWithdrawn(query_id=action.query_id, node_id=action.node.id, now=self._clock()))
            elif self._closed:  # nothing starts any more: the slot is free at once
                self._engine_handle(name, BatchFinished(batch_id=action.batch_id, now=self._clock()))
            else:
                self._start(action)

    def _start(self, batch: RunBatch) -> None:
        now = self._clock()
        batch = replace(batch, calls=tuple(replace(c, context=self._context_of(c.query_id)) for c in batch.calls))
        try:
            for call in batch.calls:
                self._feed(NodeStarted(query_id=call.query_id, node_id=call.node.id, now=now))
            work = self._run_stream(batch, now) if batch.stream else self._run_batch(batch, now)
            task = self._spawn(work)
        except Exception as exc:  # could not start it: fail its calls, free its slot
            for call in batch.calls:
                self._abort(call.query_id, exc)
            self._to_engine(batch.engine, BatchFinished(batch_id=batch.batch_id, now=self._clock()))
            return
        self._batches[(batch.engine, batch.batch_id)] = task
        self._idle.clear()
        task.add_done_callback(partial(self._batch_ended, batch))

    def _batch_ended(self, batch: RunBatch, task: asyncio.Task[None]) -> None:
        """Done callback of every batch task: its slot is free, whatever ended it."""
        self._batches.pop((batch.engine, batch.batch_id), None)
        if not task.cancelled() and task.exception() is not None:  # the runtime's own code failed
            for call in batch.calls:
                self._abort(call.query_id, task.exception())  # type: ignore[arg-type]
        self._to_engine(batch.engine, BatchFinished(batch_id=batch.batch_id, now=self._clock()))

    async def _run_batch(self, batch: RunBatch, started: float) -> None:
        calls, engine = batch.calls, self._engines[batch.engine]
        results = await engine_batch_outcomes(engine, calls, self.timeouts.for_engine(engine.limits))
        ended = self._clock()
        for call, result in zip(calls, results, strict=True):
            if call.query_id in self._queries:  # else it ended meanwhile (another of its nodes failed)
                self._done(call.query_id, call.node, started, ended, result, len(calls))
        self._feed()

    async def _run_stream(self, batch: RunBatch, started: float) -> None:
        (call,) = batch.calls
        qid, node = call.query_id, call.node
        assert node.part is not None  # only a partial decode's group starts a stream
        group = node.part.group
        engine = self._engines[batch.engine]
        timeout = self.timeouts.for_engine(engine.limits)
        self._to_streams(sg.StreamOpened(query_id=qid, group=group, now=started))

        def on_delta(text: str) -> None:
            self._to_streams(sg.StreamDelta(query_id=qid, group=group, text=text, now=self._clock()))

        output, error = await engine_stream_outcome(engine, call, timeout, on_delta)
        if error is not None:
            self._to_streams(sg.StreamFailed(query_id=qid, group=group, error=error, now=self._clock()))
        else:
            self._to_streams(sg.StreamClosed(query_id=qid, group=group, now=self._clock(), output=output))

    def _to_streams(self, event: sg.StreamEvent) -> None:
        for action in self._streams.handle(event):
            self._part_settled(action)
        self._feed()

    def _part_settled(self, action: sg.PartDone | sg.PartFailed) -> None:
        result = action.outputs if isinstance(action, sg.PartDone) else action.error
        self._done(action.query_id, action.node, action.started, action.now, result)

    def _context_of(self, qid: str) -> Any:
        run = self._queries.get(qid)
        return None if run is None else run.context

    # -- user primitives -------------------------------------------------------------------
    async def _run_user(self, qid: str, run: _QueryRun, node: Node, inputs: Mapping[str, Any]) -> None:
        started = self._clock()
        try:
            result = await user_step_outcome(node, inputs, self.timeouts.step_s)
            self._done(qid, node, started, self._clock(), result)
            run.tasks.pop(node.id, None)
            self._feed()
        except Exception as exc:  # the runtime's own code failed: fail the query, do not hang it
            self._abort(qid, exc)

    # -- helpers ---------------------------------------------------------------------------
    def _spawn(self, coro: Any, run: _QueryRun | None = None, node_id: str | None = None) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if run is not None and node_id is not None:
            run.tasks[node_id] = task
        return task
