"""Where an optimized agent's own model and tool calls run: in the caller's thread and context.

Teola schedules the calls, but the agent's handler always runs where LangChain would
run it. Async calls run the handler as a task in a copy of the caller's context
(`in_context`: LangChain's config and callbacks, so `stream_mode="messages"` sees the
tokens). Sync calls hand the handler back to the LangGraph thread that asked for it,
which blocks until the program says it is its turn (`CallerTurn`): no extra threads,
and LangChain runs the sync model and tools exactly as it would.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from teola_core.runtime.per_loop import running_loop

T = TypeVar("T")


class CallerTurn:
    """Runs a coroutine on `loop` while the calling thread waits; the coroutine can hand
    sync work back to that thread (`call`), which runs it in its own context.

    This is how a sync agent's model and tool calls are scheduled by Teola yet executed by
    the LangGraph thread that issued them, exactly as LangChain would execute them.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.Future[Any]] | None] = queue.SimpleQueue()

    async def call(self, work: Callable[[], T]) -> T:
        """On the loop: have the waiting thread run `work` now; its result or exception."""
        future: asyncio.Future[T] = self._loop.create_future()
        self._jobs.put((work, future))
        return await future

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """In the caller's thread: run `coro` on the loop, serving its `call`s, until it ends."""
        if running_loop() is self._loop:
            coro.close()
            raise RuntimeError("a sync call of an optimized agent ran on its own event loop; use the async methods")
        done = asyncio.run_coroutine_threadsafe(coro, self._loop)
        done.add_done_callback(lambda _: self._jobs.put(None))
        try:
            while (job := self._jobs.get()) is not None:
                work, future = job
                try:
                    value = work()
                except Exception as exc:
                    self._loop.call_soon_threadsafe(_settle, future, None, exc)
                else:
                    self._loop.call_soon_threadsafe(_settle, future, value, None)
        except BaseException:
            done.cancel()
            raise
        return done.result()


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():  # the waiting coroutine was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


async def in_context(context: contextvars.Context, make: Callable[[], Awaitable[T]]) -> T:
    """Await `make()` as a task in `context` (the caller's, not the engine task's)."""

    async def run() -> T:
        return await make()

    return await asyncio.get_running_loop().create_task(run(), context=context)


__all__ = ["CallerTurn", "in_context"]
