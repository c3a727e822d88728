"""Where an optimized chain's graphs run: the runtime backend and the event-loop thread.

Backends (`make_runtime`): "local" (the default) is
`teola_core.runtime.local.LocalRuntime`, the scheduled, batching runtime;
"ray" (`teola_core.runtime.ray.RayRuntime`) runs each engine as a Ray actor;
"reference" runs each query with `teola_core.runtime.reference.evaluate` (one
primitive at a time; it defines what a graph computes), useful to check a result.

Runtimes keep per-loop state (futures, queues), so an optimized runnable keeps one
runtime per event loop: async calls run on the caller's loop (their user steps see the
caller's loop, as in LangChain), sync calls on a loop the runnable owns in a daemon
thread (`LoopThread`), so `invoke` works inside and outside a running event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from teola_core.engines.protocol import EngineSet
from teola_core.ir.graph import Graph
from teola_core.runtime.base import Runtime, RuntimeHook
from teola_core.runtime.reference import evaluate

T = TypeVar("T")

BACKENDS = ("reference", "local", "ray")
DEFAULT_BACKEND = "local"


class ReferenceRuntime(Runtime):
    """The `Runtime` interface over the reference evaluator (no scheduling, no spans)."""

    def __init__(self, engines: EngineSet) -> None:
        self._engines = engines
        self._hooks: list[RuntimeHook] = []

    async def run(self, graph: Graph, inputs: Mapping[str, Any], *, query_id: str | None = None) -> dict[str, Any]:
        return await evaluate(graph, inputs, self._engines, query_id or "q0")

    def add_hook(self, hook: RuntimeHook) -> None:
        self._hooks.append(hook)


def make_runtime(engines: EngineSet, backend: str = DEFAULT_BACKEND, policy: str = "topology") -> Runtime:
    """A fresh runtime of the named backend over `engines`."""
    if backend == "reference":
        return ReferenceRuntime(engines)
    if backend == "local":
        from teola_core.runtime.local import LocalRuntime

        return LocalRuntime(engines, policy=policy)
    if backend == "ray":  # each engine copied into one Ray actor; Ray connects as `RAY_ADDRESS` says
        from teola_adapters.ray import ray_engines

        from teola_core.runtime.ray import RayRuntime

        return RayRuntime(lambda: ray_engines(engines), policy=policy, own_engines=True)
    raise ValueError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")


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
        loop = self.loop
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(
                f"a sync method of this optimized runnable was called from its own event loop ({self._name}); "
                "await the async method (ainvoke, abatch, astream) there instead"
            )
        context = contextvars.copy_context()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        tasks: list[asyncio.Task[T]] = []

        def start() -> None:
            if not future.set_running_or_notify_cancel():
                coro.close()
                return
            task = loop.create_task(coro, context=context)
            tasks.append(task)

            def done(t: asyncio.Task[T]) -> None:
                if t.cancelled():
                    future.set_exception(asyncio.CancelledError())
                elif (exc := t.exception()) is not None:
                    future.set_exception(exc)
                else:
                    future.set_result(t.result())

            task.add_done_callback(done)

        loop.call_soon_threadsafe(start)
        try:
            return future.result()
        except BaseException:
            if not future.done():
                future.cancel()
                loop.call_soon_threadsafe(lambda: [t.cancel() for t in tasks])
            raise

    def close(self) -> None:
        """Stop the loop and join its thread (idempotent)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not threading.current_thread():
            thread.join()
            loop.close()
