"""The local runtime: asyncio, in-process, the default backend.

It drives the two scheduler state machines and does all the I/O; everything it learns
comes back to them as events, and nothing polls or sleeps.

    runtime = LocalRuntime(EngineSet().add(embedder).add(llm))
    answer = await runtime.run(graph, {"question": "..."})   # many at once, from many tasks
    await runtime.close()

The path of a query:

    run()            QuerySubmitted ─► GraphScheduler ─► Dispatch(node, inputs, depth, arrival)
    Dispatch         inline (format, aggregate) ─► `ops.run_inline` now ─► NodeFinished
                     user (call, condition)     ─► task `ops.run_user`  ─► NodeFinished
                     engine                     ─► NodeReady into the engine's inbox
    flush            once per loop turn (`call_soon`, scheduled only when an inbox has
                     events): each EngineScheduler gets its inbox at once ─► RunBatch
    RunBatch         task `engine.run(calls)` (or `engine.stream(call)`), timeout applied
                     ─► NodeFinished / NodeFailed per call, BatchFinished into the inbox
    QueryDone/Failed the caller's future

Deferring the engine inboxes to one flush per loop turn is what lets nodes that became
ready in the same turn (many queries' first steps, a stage fan-out, results of batches
that finished together) share a batch; it adds no timer and no waiting beyond the turn.

Partial decode (decode pipelining): the first node of a group to be dispatched (the
group's index-0 node in pipelined graphs) starts the stream: it is queued as a solo
stream batch, holds an engine slot until the stream ends, and its deltas go through
`node.config["split_unit"].parser()`. Every dispatched node of the group waits in the
group's record and is completed, by the stream task itself, as soon as its chunk exists
(`ops.decode_chunk`: node i once item i is parsed, i < count-1; the last node, and any
node with a "text" port, at the end of the stream). A node dispatched after its chunk
exists completes at once. So each node hands on exactly what the reference evaluator
computes, and downstream work starts while the model still writes.

Failures: an exception from a primitive fails its query only (`PrimitiveError` naming
the node); an engine whose `run` raises fails every call of that batch; a batch longer
than `EngineLimits.timeout_s` fails its calls with `TimeoutError`. An exception in the
runtime's or the schedulers' own code fails the query it concerns with that exception,
never leaves it hanging. Cancelling the task awaiting `run()` cancels the query: its
pending nodes leave the engine queues, its user tasks and any batch that only it still
needs are cancelled, and the other queries go on.

Hooks receive one `PrimitiveSpan` per dispatched primitive (input and output nodes are
bookkeeping done inside the graph scheduler and get none). Times come from the
runtime's monotonic clock: ready = dispatched by the graph scheduler, started = its
batch (or task) began, ended = its result came back.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from itertools import count
from typing import Any

from teola_core.engines.protocol import Call, Engine, EngineSet
from teola_core.ir.errors import QueryCancelled
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import Placement, PrimitiveKind, spec_of
from teola_core.ir.node import Node
from teola_core.ops import decode_chunk, run_inline, run_user
from teola_core.runtime.base import PrimitiveSpan, Runtime, RuntimeHook
from teola_core.scheduler.engine_scheduler import EngineScheduler
from teola_core.scheduler.events import (
    BatchFinished,
    CancelNodes,
    Dispatch,
    EngineEvent,
    GraphAction,
    GraphEvent,
    NodeFailed,
    NodeFinished,
    NodeReady,
    NodeStarted,
    QueryCancelRequested,
    QueryDone,
    QueryFailed,
    QuerySubmitted,
    RunBatch,
)
from teola_core.scheduler.graph_scheduler import GraphScheduler
from teola_core.scheduler.policies import make_policy

_PLACEMENT = {kind: spec_of(kind).placement for kind in PrimitiveKind}

# Profile curves whose x is items or sequences (the unit of a batch); prefill's is tokens.
_BATCH_OPS = ("embed", "search", "rerank", "ingest", "decode")


def default_max_batch(engine: Engine, tolerance: float = 0.1) -> int | None:
    """An engine's max batch in items: its profile's max efficient batch for its main op,
    else `EngineLimits.max_batch_items`, else None (unbounded); never above the limit."""
    hard = engine.limits.max_batch_items
    if engine.profile is not None:
        kinds = {k.value for k in engine.kinds}
        for op in _BATCH_OPS:
            if op in engine.profile.curves and (not kinds or op in kinds):
                efficient = engine.profile.max_efficient_batch(op, tolerance)
                return efficient if hard is None else min(efficient, hard)
    return hard


def default_batch_cost(engine: Engine, hard_limit: int | None) -> Callable[[int], float] | None:
    """An engine's batch latency by items: its profile's curve for its main op, `inf` past
    `hard_limit` (None: no profile, so batches are formed by size)."""
    if engine.profile is None:
        return None
    profile = engine.profile
    kinds = {k.value for k in engine.kinds}
    op = next((op for op in _BATCH_OPS if op in profile.curves and (not kinds or op in kinds)), None)
    if op is None:
        return None
    return lambda items: math.inf if hard_limit is not None and items > hard_limit else profile.latency(op, items)


class _Stream:
    """A partial-decode group of one query: what the stream has produced so far."""

    __slots__ = ("ended", "error", "items", "started_at", "text", "waiters")

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.text = ""
        self.ended = False
        self.error: BaseException | None = None
        self.started_at: float | None = None
        self.waiters: list[Node] = []  # dispatched nodes of the group not yet completed


class _QueryRun:
    """The runtime's side of one running query."""

    __slots__ = ("batches", "future", "ready_at", "streams", "tasks")

    def __init__(self, future: asyncio.Future[dict[str, Any]]) -> None:
        self.future = future
        self.ready_at: dict[str, float] = {}  # node id -> when dispatched
        self.tasks: dict[str, asyncio.Task[None]] = {}  # user nodes running
        self.streams: dict[str, _Stream] = {}  # partial-decode group -> its stream
        self.batches: set[tuple[str, int]] = set()  # (engine, batch id) holding its calls


class _BatchRun:
    __slots__ = ("query_ids", "task")

    def __init__(self, task: asyncio.Task[None], query_ids: frozenset[str]) -> None:
        self.task = task
        self.query_ids = query_ids


class LocalRuntime(Runtime):
    """Runs queries in-process on one asyncio loop; all queries share the engine schedulers.

    engines: the engines by name. policy: "topology" (default), "fifo", "po" or "to"
    (see `teola_core.scheduler.policies`). max_batch: per-engine max batch in items,
    overriding `default_max_batch` (None in the mapping: unbounded, still capped by the
    engine's `max_batch_items`). depth_cost: weight of a node in the depth used for
    topology-aware batching (default: 1 per node; e.g. profiled latency). to_max_batch:
    the fixed max batch of the "to" policy. clock: a monotonic clock for events and spans.
    """

    def __init__(
        self,
        engines: EngineSet,
        policy: str = "topology",
        *,
        max_batch: Mapping[str, int | None] | None = None,
        depth_cost: Callable[[Node], float] | None = None,
        to_max_batch: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        overrides = dict(max_batch or {})
        unknown = set(overrides) - set(engines.engines)
        if unknown:
            raise ValueError(f"max_batch names unknown engine(s) {sorted(unknown)}")
        self._engines = engines
        self._clock = clock
        self._depth_cost = depth_cost
        self._graph = GraphScheduler()
        self._schedulers: dict[str, EngineScheduler] = {}
        for name, engine in engines.engines.items():
            limit = default_max_batch(engine)
            hard = engine.limits.max_batch_items
            if name in overrides:
                limit = overrides[name]
                limit = hard if limit is None else limit if hard is None else min(limit, hard)
                hard = limit
            self._schedulers[name] = EngineScheduler(
                name,
                policy=make_policy(policy, max_batch=to_max_batch if policy == "to" else None),
                max_batch_items=limit,
                concurrency=engine.limits.concurrency,
                instances=engine.limits.instances,
                batch_cost=default_batch_cost(engine, hard),
            )
        self._queries: dict[str, _QueryRun] = {}
        self._batches: dict[tuple[str, int], _BatchRun] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._hooks: list[RuntimeHook] = []
        self._depths: weakref.WeakKeyDictionary[Graph, dict[str, float]] = weakref.WeakKeyDictionary()
        self._ids = count()
        self._queue: deque[GraphEvent] = deque()
        self._draining = False
        self._inbox: dict[str, list[EngineEvent]] = {}
        self._flush_handle: asyncio.Handle | None = None
        self._closed = False

    # -- public ----------------------------------------------------------------------------
    def add_hook(self, hook: RuntimeHook) -> None:
        self._hooks.append(hook)

    def now(self) -> float:
        """The runtime's clock (the one `arrival` and spans are measured on)."""
        return self._clock()

    def scheduler(self, engine: str) -> EngineScheduler:
        """The engine scheduler of `engine` (for inspection)."""
        return self._schedulers[engine]

    async def run(
        self, graph: Graph, inputs: Mapping[str, Any], *, query_id: str | None = None, arrival: float | None = None
    ) -> dict[str, Any]:
        if self._closed:
            raise RuntimeError("this LocalRuntime is closed")
        qid = query_id if query_id is not None else f"q{next(self._ids)}"
        if qid in self._queries:
            raise ValueError(f"query id {qid!r} is already running")
        depths = self._depths_of(graph)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        run = self._queries[qid] = _QueryRun(future)
        self._feed(
            QuerySubmitted(query_id=qid, graph=graph, inputs=inputs, depths=depths, now=self._clock(), arrival=arrival)
        )
        try:
            return await future
        except asyncio.CancelledError:
            if self._queries.get(qid) is run:
                self._cancel(qid)
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
            run = self._queries.get(action.query_id)
            if run is not None:
                for node_id in action.node_ids:
                    task = run.tasks.pop(node_id, None)
                    if task is not None:
                        task.cancel()
        else:
            raise TypeError(f"unknown graph action {action!r}")

    def _dispatch(self, d: Dispatch) -> None:
        run = self._queries[d.query_id]
        node = d.node
        now = self._clock()
        run.ready_at[node.id] = now
        placement = _PLACEMENT[node.kind]
        if placement is Placement.INLINE:
            try:
                outputs = run_inline(node, d.inputs)
            except Exception as exc:
                self._span(d.query_id, run, node, now, now, error=exc)
                self._queue.append(NodeFailed(query_id=d.query_id, node_id=node.id, error=exc, now=now))
            else:
                self._span(d.query_id, run, node, now, now)
                self._queue.append(NodeFinished(query_id=d.query_id, node_id=node.id, outputs=outputs, now=now))
        elif placement is Placement.USER:
            self._spawn(self._run_user(d.query_id, run, node, d.inputs), run, node.id)
        elif node.engine not in self._schedulers:
            error = KeyError(f"no engine named {node.engine!r} (registered: {', '.join(sorted(self._schedulers))})")
            self._queue.append(NodeFailed(query_id=d.query_id, node_id=node.id, error=error, now=now))
        elif node.kind is PrimitiveKind.PARTIAL_DECODE:
            group = node.config["group"]
            stream = run.streams.get(group)
            if stream is None:
                stream = run.streams[group] = _Stream()
                self._to_engine(node.engine, NodeReady.from_dispatch(d, now, stream=True))
            stream.waiters.append(node)
            self._queue.extend(self._stream_events(d.query_id, run, stream))
        else:
            self._to_engine(node.engine, NodeReady.from_dispatch(d, now))

    def _finish(self, qid: str, *, result: dict[str, Any] | None = None, error: BaseException | None = None) -> None:
        """The query ended: resolve its future, drop its pending work, cancel what only it needs."""
        run = self._queries.pop(qid, None)
        if run is None:
            return
        if not run.future.done():
            if error is not None:
                run.future.set_exception(error)
            else:
                run.future.set_result(result if result is not None else {})
        if result is not None:
            return  # every node settled: nothing of it is queued or running
        for task in run.tasks.values():
            task.cancel()
        for key in run.batches:
            batch = self._batches.get(key)
            if batch is not None and not any(q in self._queries for q in batch.query_ids):
                batch.task.cancel()
        now = self._clock()
        for name in self._schedulers:
            self._to_engine(name, QueryCancelRequested(query_id=qid, now=now))

    def _cancel(self, qid: str) -> None:
        """The caller cancelled: the graph scheduler forgets the query, then clean up."""
        try:
            self._graph.handle(QueryCancelRequested(query_id=qid, now=self._clock()))
        finally:
            self._finish(qid, error=asyncio.CancelledError())

    def _abort(self, qid: str, error: BaseException) -> None:
        """Fail a query with `error` (an internal error, or the runtime closing)."""
        if qid not in self._queries:
            return
        if qid in self._graph:
            try:
                self._graph.handle(QueryCancelRequested(query_id=qid, now=self._clock()))
            except Exception as exc:
                error.add_note(f"while failing query {qid}, the graph scheduler raised {exc!r}")
        self._finish(qid, error=error)

    # -- engine events ---------------------------------------------------------------------
    def _to_engine(self, engine: str, event: EngineEvent) -> None:
        self._inbox.setdefault(engine, []).append(event)
        if self._flush_handle is None and not self._closed:
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Hand each engine scheduler its inbox at once; start the batches it forms."""
        self._flush_handle = None
        inbox, self._inbox = self._inbox, {}
        for name, events in inbox.items():
            try:
                batches = self._schedulers[name].handle(*events)
            except Exception as exc:  # a scheduler bug: fail the queries it concerned
                for event in events:
                    if isinstance(event, NodeReady):
                        self._abort(event.query_id, exc)
                continue
            for batch in batches:
                try:
                    self._start(batch)
                except Exception as exc:  # could not start it: fail its calls, free its slot
                    for call in batch.calls:
                        self._abort(call.query_id, exc)
                    if (batch.engine, batch.batch_id) not in self._batches:  # else its task frees it
                        self._batch_done(batch)

    def _start(self, batch: RunBatch) -> None:
        now = self._clock()
        query_ids = frozenset(c.query_id for c in batch.calls)
        key = (batch.engine, batch.batch_id)
        for call in batch.calls:
            try:
                self._graph.handle(NodeStarted(query_id=call.query_id, node_id=call.node.id, now=now))
            except Exception as exc:
                self._abort(call.query_id, exc)
        task = self._spawn(self._run_stream(batch, now) if batch.stream else self._run_batch(batch, now))
        self._batches[key] = _BatchRun(task, query_ids)
        for qid in query_ids:
            run = self._queries.get(qid)
            if run is not None:
                run.batches.add(key)

    async def _run_batch(self, batch: RunBatch, started: float) -> None:
        calls = batch.calls
        try:
            engine = self._engines[batch.engine]
            try:
                results: list[Any] = list(await self._with_timeout(engine, engine.run(calls), len(calls)))
                if len(results) != len(calls):
                    raise RuntimeError(
                        f"engine {batch.engine!r} returned {len(results)} results for a batch of {len(calls)} calls"
                    )
            except Exception as exc:  # the whole batch failed: every call fails with it
                results = [exc] * len(calls)
            ended = self._clock()
            events: list[GraphEvent] = []
            for call, result in zip(calls, results, strict=True):
                qid, node = call.query_id, call.node
                if isinstance(result, BaseException):
                    events.append(NodeFailed(query_id=qid, node_id=node.id, error=result, now=ended))
                elif isinstance(result, Mapping):
                    events.append(NodeFinished(query_id=qid, node_id=node.id, outputs=result, now=ended))
                else:
                    result = TypeError(f"engine {batch.engine!r} returned {type(result).__name__}, not a mapping")
                    events.append(NodeFailed(query_id=qid, node_id=node.id, error=result, now=ended))
                run = self._queries.get(qid)
                if run is not None:
                    error = result if isinstance(result, BaseException) else None
                    self._span(qid, run, node, started, ended, batch_size=len(calls), error=error)
            self._feed(*events)
        except Exception as exc:  # the runtime's own code failed: fail the batch's queries
            for call in calls:
                self._abort(call.query_id, exc)
        finally:
            self._batch_done(batch)

    async def _run_stream(self, batch: RunBatch, started: float) -> None:
        (call,) = batch.calls
        qid, node = call.query_id, call.node
        run = self._queries.get(qid)
        try:
            if run is None:
                return
            stream = run.streams[node.config["group"]]
            stream.started_at = started
            engine = self._engines[batch.engine]
            try:
                await self._with_timeout(engine, self._consume(engine, call, stream, run), 1)
            except Exception as exc:
                stream.error = exc
            else:
                stream.ended = True
            self._feed(*self._stream_events(qid, run, stream))
        except Exception as exc:
            self._abort(qid, exc)
        finally:
            self._batch_done(batch)

    async def _consume(self, engine: Engine, call: Call, stream: _Stream, run: _QueryRun) -> None:
        parser = call.node.config["split_unit"].parser()
        deltas: list[str] = []
        async for delta in engine.stream(call):
            deltas.append(delta)
            items = parser.feed(delta)
            if items:
                stream.items.extend(items)
                if stream.waiters:
                    self._feed(*self._stream_events(call.query_id, run, stream))
        stream.items.extend(parser.close())
        stream.text = "".join(deltas)  # only the group's last node hands it on, at the end

    def _stream_events(self, qid: str, run: _QueryRun, stream: _Stream) -> list[GraphEvent]:
        """Complete the group's waiting nodes whose chunk exists (or fail them all)."""
        if stream.started_at is None:
            return []
        events: list[GraphEvent] = []
        waiting: list[Node] = []
        now = self._clock()
        n_items = len(stream.items)
        for node in stream.waiters:
            index, n = node.config["index"], node.config["count"]
            wants_text = node.output_port("text") is not None
            if stream.error is not None:
                events.append(NodeFailed(query_id=qid, node_id=node.id, error=stream.error, now=now))
                self._span(qid, run, node, stream.started_at, now, error=stream.error)
            elif stream.ended or (index < n - 1 and n_items > index and not wants_text):
                outputs: dict[str, Any] = {"items": decode_chunk(stream.items, index, n)}
                if wants_text:
                    outputs["text"] = stream.text
                events.append(NodeFinished(query_id=qid, node_id=node.id, outputs=outputs, now=now))
                self._span(qid, run, node, stream.started_at, now)
            else:
                waiting.append(node)
        stream.waiters = waiting
        return events

    async def _with_timeout(self, engine: Engine, work: Any, n_calls: int) -> Any:
        """Await `work` within the engine's `timeout_s`; name the engine when it runs past."""
        timeout = engine.limits.timeout_s
        if timeout is None:
            return await work
        scope = asyncio.timeout(timeout)
        try:
            async with scope:
                return await work
        except TimeoutError as exc:
            if scope.expired():
                raise TimeoutError(
                    f"engine {engine.name!r}: a batch of {n_calls} call(s) ran past timeout_s={timeout}"
                ) from exc
            raise

    def _batch_done(self, batch: RunBatch) -> None:
        key = (batch.engine, batch.batch_id)
        self._batches.pop(key, None)
        for call in batch.calls:
            run = self._queries.get(call.query_id)
            if run is not None:
                run.batches.discard(key)
        if not self._closed:
            self._to_engine(batch.engine, BatchFinished(batch_id=batch.batch_id, now=self._clock()))

    # -- user primitives -------------------------------------------------------------------
    async def _run_user(self, qid: str, run: _QueryRun, node: Node, inputs: Mapping[str, Any]) -> None:
        started = self._clock()
        event: GraphEvent
        try:
            try:
                outputs = await run_user(node, inputs)
            except Exception as exc:
                ended = self._clock()
                event = NodeFailed(query_id=qid, node_id=node.id, error=exc, now=ended)
                self._span(qid, run, node, started, ended, error=exc)
            else:
                ended = self._clock()
                event = NodeFinished(query_id=qid, node_id=node.id, outputs=outputs, now=ended)
                self._span(qid, run, node, started, ended)
            run.tasks.pop(node.id, None)
            self._feed(event)
        except Exception as exc:
            self._abort(qid, exc)

    # -- helpers ---------------------------------------------------------------------------
    def _spawn(self, coro: Any, run: _QueryRun | None = None, node_id: str | None = None) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if run is not None and node_id is not None:
            run.tasks[node_id] = task
        return task

    def _depths_of(self, graph: Graph) -> dict[str, float] | None:
        if self._depth_cost is None:
            return None  # the graph scheduler's default: path length in nodes
        depths = self._depths.get(graph)
        if depths is None:
            depths = self._depths[graph] = graph.depths(self._depth_cost)
        return depths

    def _span(
        self,
        qid: str,
        run: _QueryRun,
        node: Node,
        started: float,
        ended: float,
        *,
        batch_size: int = 1,
        error: BaseException | None = None,
    ) -> None:
        ready = run.ready_at.pop(node.id, started)
        if not self._hooks:
            return
        span = PrimitiveSpan(
            query_id=qid,
            node=node,
            ready_at=ready,
            started_at=max(started, ready),
            ended_at=ended,
            batch_size=batch_size,
            error=None if error is None else f"{type(error).__name__}: {error}",
        )
        for hook in self._hooks:
            try:
                hook.on_span(span)
            except Exception as exc:  # an observer failed: report it where asyncio reports errors
                asyncio.get_running_loop().call_exception_handler(
                    {"message": f"runtime hook {hook!r} failed on a span of {node.describe()}", "exception": exc}
                )
