"""What a retriever's `retrieve` / `aretrieve` records, opened around the primitives it became.

    spans = RetrievalSpans(retriever, query, ctx)
    bundle, inner = spans.open()       # its span, RetrievalStartEvent, the RETRIEVE callback, `_retrieve`'s span
    ...                                # EMBED and SEARCH run in `inner` (their spans, events, callbacks)
    nodes = spans.finish(hits)         # `_retrieve` exits, IndexNodes resolve, the rest closes (`afinish`: async)

Plain LlamaIndex emits these from `BaseRetriever.(a)retrieve` and the retriever's `_(a)retrieve`
(their `@dispatcher.span`, `callback_manager.as_trace("query")` and `.event(RETRIEVE)`; `_aretrieve` is a
span only where the class declares one: `VectorIndexRetriever` does, `QueryFusionRetriever` does not).
Teola runs what `_(a)retrieve` does as primitives between them (a vector retriever's embedding and search,
a fusion retriever's query generation and sub-retrievals), so it emits them itself: the same dispatchers, span
names, parents, tags, arguments, instances and results, each span entered and left in one context as the
decorator does. A failure (`fail`; also when the query fails elsewhere, `QueryContext.on_failure`) unwinds
what is open as the decorators and the context managers do. Details: docs/llamaindex.md.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import uuid
from dataclasses import dataclass
from typing import Any

import llama_index.core.instrumentation as instrument
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks.base import CallbackManager, EventContext
from llama_index.core.callbacks.schema import CBEventType, EventPayload
from llama_index.core.instrumentation.dispatcher import Dispatcher, active_instrument_tags
from llama_index.core.instrumentation.events.retrieval import RetrievalEndEvent, RetrievalStartEvent
from llama_index.core.instrumentation.events.span import SpanDropEvent
from llama_index.core.instrumentation.span import active_span_id
from llama_index.core.schema import NodeWithScore, QueryBundle

from teola_llamaindex.scope import QueryContext

_BASE = instrument.get_dispatcher(BaseRetriever.__module__)  # `retrieve` / `aretrieve`'s
_TRACE = "query"  # `as_trace("query")`


@dataclass
class _Span:
    """An open span and the context it was entered in (and is left in)."""

    dispatcher: Dispatcher
    id_: str
    bound_args: inspect.BoundArguments
    instance: Any
    scope: contextvars.Context

    def exit(self, result: Any) -> None:
        self.scope.run(
            self.dispatcher.span_exit, id_=self.id_, bound_args=self.bound_args, instance=self.instance, result=result
        )

    def drop(self, error: BaseException) -> None:
        self.scope.run(self._drop, error)

    def _drop(self, error: BaseException) -> None:
        self.dispatcher.event(SpanDropEvent(span_id=self.id_, err_str=str(error)))
        self.dispatcher.span_drop(id_=self.id_, bound_args=self.bound_args, instance=self.instance, err=error)


def _enter(dispatcher: Dispatcher, instance: Any, method: str, *args: Any, scope: contextvars.Context) -> _Span:
    """Enter the span of `instance.method(*args)` in `scope` as `dispatcher.span`'s wrapper does
    (id, arguments, parent, tags; the span is the active one in `scope` from then on)."""
    id_ = f"{type(instance).__name__}.{method}-{uuid.uuid4()}"
    bound_args = inspect.signature(getattr(instance, method)).bind(*args)

    def enter() -> None:
        tags = active_instrument_tags.get()
        parent = active_span_id.get()
        active_span_id.set(id_)
        dispatcher.span_enter(id_=id_, bound_args=bound_args, instance=instance, parent_id=parent, tags=tags)

    scope.run(enter)
    return _Span(dispatcher, id_, bound_args, instance, scope)


def body_dispatcher(retriever: BaseRetriever, body: str) -> Dispatcher | None:
    """The dispatcher of the span `retriever.<body>` opens (`_retrieve`, `_aretrieve`), or None
    when the class's method is not a span (`dispatcher.span` wraps it: it has `__wrapped__`)."""
    method = getattr(type(retriever), body)
    if not hasattr(method, "__wrapped__"):
        return None
    return instrument.get_dispatcher(method.__module__)


class RetrievalSpans:
    """One retrieval's own records (see the module docstring). `ctx`: where plain calls `retrieve`."""

    def __init__(self, retriever: BaseRetriever, query: Any, ctx: QueryContext) -> None:
        self.retriever = retriever
        self.query = query
        self.ctx = ctx
        self.calls = ctx  # the context of this retrieval's own calls (a sync query's hold the caller)
        self.bundle = QueryBundle(query) if isinstance(query, str) else query
        self._outer: _Span | None = None  # `retrieve`'s span; its scope holds the callback trace and event
        self._inner: _Span | None = None  # `_retrieve`'s span
        self._manager: CallbackManager | None = None
        self._traced = False  # inside `as_trace("query")`
        self._event: EventContext | None = None  # the RETRIEVE callback event

    def open(self) -> tuple[QueryBundle, QueryContext]:
        """Everything up to `_retrieve`'s body: the bundle and the context its primitives run in."""
        r, sync = self.retriever, self.ctx.sync
        outer = self.ctx.scope.copy()
        self._outer = _enter(_BASE, r, "retrieve" if sync else "aretrieve", self.query, scope=outer)
        body = "_retrieve" if sync else "_aretrieve"
        try:
            outer.run(self._start)
            dispatcher = body_dispatcher(r, body)
            if dispatcher is not None:
                self._inner = _enter(dispatcher, r, body, self.bundle, scope=outer.copy())
        except BaseException as error:
            self.fail(error)
            raise
        # A sync query's other calls wait until this retrieval closes, as in plain's sequential run.
        self.calls = self.ctx.held(self)
        inner = self.calls.within(self._inner.scope if self._inner is not None else outer.copy())
        self.ctx.on_failure(self.fail)  # last: whoever closes on a failure finds everything open
        return self.bundle, inner

    def _start(self) -> None:
        """`retrieve`'s body up to `_retrieve` (in its span's context)."""
        self.retriever._check_callback_manager()
        _BASE.event(RetrievalStartEvent(str_or_query_bundle=self.query))
        self._manager = manager = self.retriever.callback_manager
        manager.start_trace(trace_id=_TRACE)
        self._traced = True
        event = EventContext(manager, CBEventType.RETRIEVE)
        event.on_start(payload={EventPayload.QUERY_STR: self.bundle.query_str})
        self._event = event

    def finish(self, hits: list[NodeWithScore]) -> list[NodeWithScore]:
        """The rest of a sync `retrieve` after the search (on the caller's thread): the nodes."""
        self._searched(hits)
        assert self._outer is not None
        try:
            nodes = self._outer.scope.copy().run(self.retriever._handle_recursive_retrieval, self.bundle, hits)
        except BaseException as error:
            self.fail(error)
            raise
        self._close(nodes)
        return nodes

    async def afinish(self, hits: list[NodeWithScore]) -> list[NodeWithScore]:
        """The rest of `aretrieve` after the search: the nodes."""
        self._searched(hits)
        assert self._outer is not None
        resolve = self.retriever._ahandle_recursive_retrieval(query_bundle=self.bundle, nodes=hits)
        try:
            nodes = await asyncio.get_running_loop().create_task(resolve, context=self._outer.scope.copy())
        except BaseException as error:
            self.fail(error)
            raise
        self._close(nodes)
        return nodes

    def _searched(self, hits: list[NodeWithScore]) -> None:
        """`_(a)retrieve` returned `hits`: its span (if it is one) exits."""
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.exit(hits)

    def _close(self, nodes: list[NodeWithScore]) -> None:
        assert self._outer is not None
        try:
            self._outer.scope.run(self._end, nodes)
        except BaseException as error:
            self.fail(error)
            raise
        outer, self._outer = self._outer, None
        self.ctx.settled(self.fail)
        outer.exit(nodes)
        self.ctx.released(self)

    def _end(self, nodes: list[NodeWithScore]) -> None:
        """`retrieve`'s body after the nodes are resolved (in its span's context)."""
        assert self._event is not None and self._manager is not None
        self._event.on_end(payload={EventPayload.NODES: nodes})
        self._traced = False
        self._manager.end_trace(trace_id=_TRACE)
        _BASE.event(RetrievalEndEvent(str_or_query_bundle=self.query, nodes=nodes))

    def fail(self, error: BaseException) -> None:
        """Unwind what is open with `error`, innermost first, as plain's decorators and context managers do."""
        self.ctx.settled(self.fail)
        self.ctx.released(self)
        if self._inner is not None:
            inner, self._inner = self._inner, None
            inner.drop(error)
        if self._outer is not None:
            outer, self._outer = self._outer, None
            try:
                outer.scope.run(self._unwind, error)
            finally:
                outer.drop(error)

    def _unwind(self, error: BaseException) -> None:
        """The exits of `callback_manager.event(RETRIEVE)` and `as_trace("query")` on `error`."""
        if self._event is not None and not self._event.finished:
            payload = None
            if isinstance(error, Exception) and not hasattr(error, "event_added"):
                payload = {EventPayload.EXCEPTION: error}
                error.event_added = True  # type: ignore[attr-defined]
            self._event.on_end(payload=payload)
        if self._traced:
            assert self._manager is not None
            self._traced = False
            if isinstance(error, Exception) and not hasattr(error, "event_added"):
                self._manager.on_event_start(CBEventType.EXCEPTION, payload={EventPayload.EXCEPTION: error})
                error.event_added = True  # type: ignore[attr-defined]
            self._manager.end_trace(trace_id=_TRACE)
