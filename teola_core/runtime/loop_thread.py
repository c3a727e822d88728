"""An event loop in a daemon thread, for the sync methods of the drop-in objects.

Runtimes keep per-loop state (futures, queues), so an optimized object keeps one
runtime per event loop: async calls run on the caller's loop, sync calls on a loop the
object owns in a daemon thread (`LoopThread`), so a sync method works inside and
outside a running event loop. Both framework adapters use it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """An event loop in a daemon thread, started on first use, for sync callers.

    `run(coro)` runs the coroutine there in a copy of the caller's contextvars (so
    LangChain's config and tracing context carry over) and blocks until it is done.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                ready = threading.Event()
                loop = asyncio.new_event_loop()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=serve, name=self._name, daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        future = self.submit(coro)
        try:
            return future.result()
        except BaseException:
            if not future.done():
                future.cancel()
            raise

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `coro` on the loop (in a copy of the caller's contextvars); cancel the future to cancel it.

        For a caller that does other work on its own thread while it waits (see `run`).
        """
        loop = self.loop
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(
                f"a sync method of this optimized object was called from its own event loop ({self._name}); "
                "await its async counterpart (ainvoke, arun, aquery, ...) there instead"
            )
        future: _TaskFuture[T] = _TaskFuture(loop)
        context = contextvars.copy_context()

        def start() -> None:
            if not future.set_running_or_notify_cancel():
                coro.close()
                return
            future.task = task = loop.create_task(coro, context=context)

            def done(t: asyncio.Task[T]) -> None:
                if t.cancelled():
                    future.set_exception(asyncio.CancelledError())
                elif (exc := t.exception()) is not None:
                    future.set_exception(exc)
                else:
                    future.set_result(t.result())

            task.add_done_callback(done)

        loop.call_soon_threadsafe(start)
        return future

    def close(self) -> None:
        """Cancel the loop's remaining tasks, wait for them, stop the loop, join its thread.

        Like the end of `asyncio.run`: a task still running (a cancelled query's stream
        winding down, say) runs its cleanup now instead of being destroyed pending when
        the loop closes. Called from the loop's own thread it can only stop the loop.
        Idempotent.
        """
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        if thread is threading.current_thread():
            loop.stop()
            return
        try:
            asyncio.run_coroutine_threadsafe(_cancel_remaining(loop), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()


class _TaskFuture(concurrent.futures.Future[T]):
    """The future of a coroutine started on a `LoopThread`: `cancel()` also cancels its task."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._loop = loop
        self.task: asyncio.Task[T] | None = None  # set on the loop, by the start callback

    def cancel(self) -> bool:
        if super().cancel():  # not started yet: it never will be
            return True
        if not self.done():  # runs after the start callback (call_soon keeps order)
            self._loop.call_soon_threadsafe(self._cancel_task)
        return False

    def _cancel_task(self) -> None:
        if self.task is not None:
            self.task.cancel()


async def _cancel_remaining(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel every other task of the loop and wait for them; report their errors as asyncio does."""
    tasks = [t for t in asyncio.all_tasks(loop) if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            loop.call_exception_handler(
                {
                    "message": "unhandled exception in a task while closing its loop",
                    "exception": task.exception(),
                    "task": task,
                }
            )
    await loop.shutdown_asyncgens()
    await loop.shutdown_default_executor()
