"""Where a traced step runs the framework's own code: in the caller's context, on its thread.

    ctx = QueryContext(sync=True, caller=CallerThread())  # taken inside the framework's own span
    nodes = await ctx.call(retriever.retrieve, retriever.aretrieve, bundle)

LlamaIndex keeps its instrumentation state (active span, callback trace stack, tags) in
contextvars, so every step runs in a copy of the context captured where plain LlamaIndex
would have run it: spans, events and callback events nest as they do without Teola. Sync
queries run the framework's sync API on the thread that called the sync method, outside
any running loop (`CallerLoop`, or `CallerThread` where that thread runs a loop already),
so thread-bound resources (an in-memory SQLite connection, thread locals) behave the same.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import queue
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

_Job = tuple[Callable[[], Any], asyncio.Future[Any], asyncio.AbstractEventLoop, object]
_WAKE = "wake"  # a held-back job may run now


def _may_run(owner: object, holder: object) -> bool:
    """A job submitted by `owner` may run now: nobody holds the caller, or `owner` does."""
    return holder is None or owner is holder


class CallerThread:
    """Runs a sync query's framework calls on the thread blocked in `serve` (the caller's),
    while the graph runs on another thread's loop (the caller's own loop is busy).

    While a step holds the caller (`hold`), only that step's calls run (the others wait, in
    order): a retrieval's records then follow each other as in plain's sequential run.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | str | None] = queue.SimpleQueue()
        self._waiting: list[_Job] = []  # received, not run yet (held back, or about to run)
        self._holder: object = None

    async def submit(self, fn: Callable[[], T], owner: object = None) -> T:
        """`fn()` on the caller's thread; its result or exception comes back here."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((fn, future, loop, owner))
        return await future

    def hold(self, owner: object) -> None:
        """Run only `owner`'s calls (`submit(..., owner)`) until `release(owner)`."""
        self._holder = owner

    def release(self, owner: object) -> None:
        if self._holder is owner:
            self._holder = None
            self._jobs.put(_WAKE)

    def serve(self, done: concurrent.futures.Future[T]) -> T:
        """Run submitted calls, in order (a holder's first), until `done` is; then its result."""
        done.add_done_callback(lambda _: self._jobs.put(None))
        try:
            while (job := self._next()) is not None:
                fn, future, loop, _ = job
                try:
                    result = fn()
                except Exception as exc:
                    loop.call_soon_threadsafe(_settle, future, None, exc)
                else:
                    loop.call_soon_threadsafe(_settle, future, result, None)
            return done.result()
        except BaseException:  # KeyboardInterrupt and the like: the query stops with the caller
            done.cancel()
            raise

    def _next(self) -> _Job | None:
        while True:
            for i, job in enumerate(self._waiting):
                if _may_run(job[3], self._holder):
                    return self._waiting.pop(i)
            item = self._jobs.get()
            if item is None:
                return None
            if not isinstance(item, str):
                self._waiting.append(item)


class CallerLoop:
    """Runs a sync query's graph on an event loop of the calling thread, driven by `drive`:
    the loop turns until a framework call is due, which then runs outside the loop (as in
    plain LlamaIndex: no running loop), and so on until the graph is done. No thread hops.
    `hold` / `release` as for `CallerThread`.
    """

    _loops = threading.local()

    def __init__(self) -> None:
        self._jobs: collections.deque[tuple[Callable[[], Any], asyncio.Future[Any], object]] = collections.deque()
        self._wake: asyncio.Future[None] | None = None
        self._holder: object = None

    @classmethod
    def usable(cls) -> bool:
        """True when this thread runs no event loop (else a loop thread has to run the graph)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return True
        return False

    async def submit(self, fn: Callable[[], T], owner: object = None) -> T:
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._jobs.append((fn, future, owner))
        self._poke()
        return await future

    def hold(self, owner: object) -> None:
        self._holder = owner

    def release(self, owner: object) -> None:
        if self._holder is owner:
            self._holder = None
            self._poke()

    def drive(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` on this thread's loop (kept for the thread's life, so runtimes stay)."""
        loop = self._loop()
        task = loop.create_task(work, context=contextvars.copy_context())
        try:
            while True:
                loop.run_until_complete(self._due(task))
                while (job := self._take()) is not None:
                    fn, future, _ = job
                    try:
                        result = fn()
                    except Exception as exc:
                        _settle(future, None, exc)
                    else:
                        _settle(future, result, None)
                if task.done():
                    return task.result()
        except BaseException:  # KeyboardInterrupt and the like: the query stops with the caller
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    loop.run_until_complete(task)
            raise

    def _take(self) -> tuple[Callable[[], Any], asyncio.Future[Any], object] | None:
        """The first job that may run now (any, or the holder's), taken off the queue."""
        for i, job in enumerate(self._jobs):
            if _may_run(job[2], self._holder):
                del self._jobs[i]
                return job
        return None

    def _poke(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def _due(self, task: asyncio.Task[Any]) -> None:
        """Return once a framework call that may run is due, or the work is done."""
        while not task.done() and not any(_may_run(job[2], self._holder) for job in self._jobs):
            self._wake = wake = asyncio.get_running_loop().create_future()
            task.add_done_callback(lambda _, wake=wake: wake.done() or wake.set_result(None))
            await wake

    @classmethod
    def _loop(cls) -> asyncio.AbstractEventLoop:
        loop = getattr(cls._loops, "loop", None)
        if loop is None or loop.is_closed():
            loop = cls._loops.loop = asyncio.new_event_loop()
            weakref.finalize(threading.current_thread(), loop.close)
        return loop


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the step was cancelled meanwhile (its query failed)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


@dataclass(frozen=True)
class QueryContext:
    """One query's facts for its steps: sync or async API, the caller's context and thread.

    `scope`: the contextvars where plain LlamaIndex runs the traced code (captured when
    the query starts, inside the framework's own span). `caller`: for sync queries, the
    calling thread (None: a worker thread, where the caller cannot serve). `open`: what
    steps opened around primitives and must close if the query fails (`on_failure`), and
    `failure` its error once it did (both shared by the contexts derived from it).
    `owner`: the step that holds the caller (`CallerThread.hold`) whose calls these are.
    """

    sync: bool
    scope: contextvars.Context = field(default_factory=contextvars.copy_context, compare=False)
    caller: CallerThread | CallerLoop | None = field(default=None, compare=False)
    modules: dict[str, QueryContext] = field(default_factory=dict, compare=False, repr=False)
    open: list[Callable[[BaseException], None]] = field(default_factory=list, compare=False, repr=False)
    failure: list[BaseException] = field(default_factory=list, compare=False, repr=False)
    owner: object = field(default=None, compare=False, repr=False)

    def __reduce__(self) -> tuple[Any, ...]:
        """Sent to another process (a Ray actor): only `sync` travels; the caller's context cannot."""
        return (QueryContext, (self.sync,))

    def in_module(self, module: str, scope: contextvars.Context) -> QueryContext:
        """This query's context for one module that runs in a scope of its own (a span of its own)."""
        ctx = self.modules[module] = dataclasses.replace(self, scope=scope)
        return ctx

    def for_module(self, module: str | None) -> QueryContext:
        """The context a module's primitives run in (`in_module`'s, or the query's)."""
        return self.modules.get(module, self) if module is not None else self

    def within(self, scope: contextvars.Context) -> QueryContext:
        """This query's context with its framework calls in `scope` (a span a step opened)."""
        return dataclasses.replace(self, scope=scope)

    def held(self, owner: object) -> QueryContext:
        """A sync query: `owner` holds the caller (only its calls run there) until `released`;
        the context its calls go through. Other queries: this context."""
        if not (self.sync and self.caller is not None):
            return self
        self.caller.hold(owner)
        return dataclasses.replace(self, owner=owner)

    def released(self, owner: object) -> None:
        """`owner` no longer holds the caller (nothing if it did not)."""
        if self.sync and self.caller is not None:
            self.caller.release(owner)

    def on_failure(self, close: Callable[[BaseException], None]) -> None:
        """Have `close(error)` called if the query fails (`fail`), unless `settled` first; at
        once if it failed already (on another thread, while the caller was opening)."""
        self.open.append(close)
        if self.failure:
            try:
                self.open.remove(close)  # taking it off the list: this thread closes it
            except ValueError:
                return  # `fail` took it
            close(self.failure[0])

    def settled(self, close: Callable[[BaseException], None]) -> None:
        """`close` is no longer needed (what it closes was closed)."""
        with contextlib.suppress(ValueError):
            self.open.remove(close)

    def fail(self, error: BaseException) -> None:
        """The query failed with `error`: close what is still open, the last opened first."""
        self.failure.append(error)
        while True:
            try:
                close = self.open.pop()
            except IndexError:
                return
            close(error)

    async def call(
        self, sync_fn: Callable[..., T], async_fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any
    ) -> T:
        """The framework's sync API for sync queries, its async API for async ones."""
        if self.sync:
            return await self.blocking(sync_fn, *args, **kwargs)
        return await self.awaiting(async_fn(*args, **kwargs))

    async def blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A sync framework call: on the caller's thread (sync queries) or a worker thread."""
        scoped = self.scope.copy()
        if self.sync and self.caller is not None:
            return await self.caller.submit(lambda: scoped.run(fn, *args, **kwargs), self.owner)
        return await asyncio.to_thread(scoped.run, fn, *args, **kwargs)

    async def awaiting(self, coro: Coroutine[Any, Any, T]) -> T:
        """An async framework call, as a task in a copy of the scope (cancelled with the step)."""
        return await asyncio.get_running_loop().create_task(coro, context=self.scope.copy())
