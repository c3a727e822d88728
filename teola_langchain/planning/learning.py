"""Learning a chain's latencies from its own calls, on Teola's graph or as LangChain runs them.

How it hooks in, and why this way: LangChain's `register_configure_hook`, the mechanism its
own `collect_runs` uses. A context variable, set only while a call of an optimized chain
runs (`observing`), holds that call's `Observer`; every callback manager LangChain
configures in that context gets it as a *non-inheritable* handler. So it sees every run
of the call (composites, leaves, models, retrievers), whoever executes them, and nothing a
user can see changes: the `callbacks` each step is given (`config["callbacks"]`, made
from inheritable handlers) are what they were, and the handler never streams, raises or
touches a value. The alternatives lose: a handler added to the call's config is
inherited into every child's `config["callbacks"]` (user code and tests see it); a local
one on the root sees the root only. It is not `run_inline`: langchain-core 1.8's async
`on_llm_start` skips every other handler of a manager that has an inline one, so an
inline observer would hide model runs from the user's own tracers. A sync call gets an
`Observer` (sync methods, called in the step's own thread), an async call an
`AsyncObserver` (coroutine methods, awaited on the loop): LangChain would send a sync,
non-inline handler of an async run through the loop's executor, a thread hop per event.

What is observed (into the runnable's `LatencyBook`): each run's wall time under its step
key (`tracing/keys.py`; failed runs are not counted), the length of list outputs (how many items
a list parser produced: decode pipelining's plan), and the whole call (`keys.CHAIN`).
Engine calls on the graph (embedding and search batches, by size) come from the
runtime's spans (`SpanLearner`).

    with observing(Observer(book)):
        chain.invoke(x)          # every run of the call reports to book
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tracers.context import register_configure_hook

from teola_core.ir.kinds import PrimitiveKind
from teola_core.passes.estimates import RUN
from teola_core.profiles.learning import LatencyBook
from teola_core.runtime.base import PrimitiveSpan
from teola_langchain.configure_hooks import holding
from teola_langchain.tracing import keys

_OBSERVER: ContextVar[Observer | None] = ContextVar("teola_langchain_observer", default=None)


@dataclass
class _Run:
    key: str
    inherited: tuple[str, ...]  # the tags its children inherit (its own, less the one its composite gave it)
    started: float


class Observer(BaseCallbackHandler):
    """Times every run of one call and reports it to `book` (see the module docstring).

    clock: seconds, monotonic (tests pass a virtual one).
    """

    run_inline = False  # see the module docstring
    raise_error = False
    teola_structure_only = True  # it times runs, records none (`runs.records_runs`)

    def __init__(self, book: LatencyBook, clock: Callable[[], float] = time.perf_counter) -> None:
        self.book = book
        self._clock = clock
        self._runs: dict[UUID, _Run] = {}
        self._lock = threading.Lock()

    # -- bookkeeping -----------------------------------------------------------------
    def _start(self, run_id: UUID, parent_run_id: UUID | None, tags: list[str] | None, name: str) -> None:
        now = self._clock()
        tags = list(tags or ())
        with self._lock:
            parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
            if parent is None:  # the call's root (one per input of a batch)
                self._runs[run_id] = _Run(keys.CHAIN, tuple(tags), now)
                return
            tag = keys.structural_tag(tags, parent.inherited)
            inherited = tuple(t for t in tags if t != tag)
            self._runs[run_id] = _Run(keys.child_key(parent.key, name, tag), inherited, now)

    def _end(self, run_id: UUID, output: Any) -> None:
        now = self._clock()
        with self._lock:
            run = self._runs.pop(run_id, None)
        if run is None:
            return
        self.book.observe(run.key, RUN, 1, now - run.started)
        if isinstance(output, list):
            self.book.observe_count(run.key, len(output))
        elif isinstance(output, str):
            self.book.observe_words(run.key, len(output.split()))

    def _drop(self, run_id: UUID) -> None:
        with self._lock:
            self._runs.pop(run_id, None)

    # -- LangChain's callbacks ---------------------------------------------------------
    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        self._start(run_id, parent_run_id, tags, _name(serialized, kwargs))

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, outputs)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._drop(run_id)

    def on_retriever_start(
        self,
        serialized: dict[str, Any] | None,
        query: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        self._start(run_id, parent_run_id, tags, _name(serialized, kwargs))

    def on_retriever_end(self, documents: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, None)

    def on_retriever_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._drop(run_id)

    def on_llm_start(
        self,
        serialized: dict[str, Any] | None,
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        self._start(run_id, parent_run_id, tags, _name(serialized, kwargs))

    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[Any]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        self._start(run_id, parent_run_id, tags, _name(serialized, kwargs))

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, None)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._drop(run_id)


def _name(serialized: dict[str, Any] | None, kwargs: dict[str, Any]) -> str:
    """The run's name as LangChain's tracers name it (`name=`, else the serialized object's)."""
    name = kwargs.get("name")
    if name:
        return str(name)
    if serialized:
        if serialized.get("name"):
            return str(serialized["name"])
        ids = serialized.get("id")
        if isinstance(ids, list) and ids:
            return str(ids[-1])
    return "Unnamed"


class AsyncObserver(Observer):
    """The `Observer` of an async call: the same bookkeeping, as coroutines LangChain awaits on the loop."""

    async def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:  # type: ignore[override]
        Observer.on_chain_start(self, serialized, inputs, **kwargs)

    async def on_chain_end(self, outputs: Any, **kwargs: Any) -> None:  # type: ignore[override]
        Observer.on_chain_end(self, outputs, **kwargs)

    async def on_chain_error(self, error: BaseException, **kwargs: Any) -> None:  # type: ignore[override]
        Observer.on_chain_error(self, error, **kwargs)

    async def on_retriever_start(self, serialized: Any, query: str, **kwargs: Any) -> None:  # type: ignore[override]
        Observer.on_retriever_start(self, serialized, query, **kwargs)

    async def on_retriever_end(self, documents: Any, **kwargs: Any) -> None:  # type: ignore[override]
        Observer.on_retriever_end(self, documents, **kwargs)

    async def on_retriever_error(self, error: BaseException, **kwargs: Any) -> None:  # type: ignore[override]
        Observer.on_retriever_error(self, error, **kwargs)

    async def on_llm_start(self, serialized: Any, prompts: list[str], **kwargs: Any) -> None:  # type: ignore[override]
        Observer.on_llm_start(self, serialized, prompts, **kwargs)

    async def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:  # type: ignore[override]
        Observer.on_chat_model_start(self, serialized, messages, **kwargs)

    async def on_llm_end(self, response: Any, **kwargs: Any) -> None:  # type: ignore[override]
        Observer.on_llm_end(self, response, **kwargs)

    async def on_llm_error(self, error: BaseException, **kwargs: Any) -> None:  # type: ignore[override]
        Observer.on_llm_error(self, error, **kwargs)


def observing(observer: Observer) -> AbstractContextManager[None]:
    """Runs started inside (and in contexts copied from inside) report to `observer`."""
    return holding(_OBSERVER, observer)


_ENGINE_OPS = frozenset({PrimitiveKind.EMBED, PrimitiveKind.SEARCH, PrimitiveKind.RERANK, PrimitiveKind.INGEST})


class SpanLearner:
    """A runtime hook: each embedding, search, rerank or ingest batch's time, by batch size,
    under its engine's name (the engine profile the passes read). Model calls are learned
    per step from their callback runs instead: a framework model's call is prefill and
    decode in one, which an engine curve per token cannot describe."""

    def __init__(self, book: LatencyBook) -> None:
        self.book = book

    def on_span(self, span: PrimitiveSpan) -> None:
        node = span.node
        if span.error is None and node.engine is not None and node.kind in _ENGINE_OPS:
            self.book.observe(node.engine, node.kind.value, span.batch_size, span.ended_at - span.started_at)


register_configure_hook(_OBSERVER, inheritable=False)
