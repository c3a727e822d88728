"""Choosing where an optimized app's graphs run, by name.

Backends (`make_runtime`): "local" (the default) is
`teola_core.runtime.local.LocalRuntime`, the scheduled, batching runtime; "ray"
(`teola_core.runtime.ray.RayRuntime`) runs each engine as a pool of Ray actors;
"reference" runs each query with `teola_core.runtime.reference.evaluate` (one
primitive at a time; it defines what a graph computes), useful to check a result.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from teola_core.engines.protocol import EngineSet
from teola_core.ir.graph import Graph
from teola_core.runtime.base import Runtime, RuntimeHook
from teola_core.runtime.reference import evaluate
from teola_core.runtime.timeouts import Timeouts

BACKENDS = ("reference", "local", "ray")
DEFAULT_BACKEND = "local"


class ReferenceRuntime(Runtime):
    """The `Runtime` interface over the reference evaluator (no scheduling, no spans)."""

    def __init__(self, engines: EngineSet) -> None:
        self._engines = engines
        self._hooks: list[RuntimeHook] = []

    async def run(
        self, graph: Graph, inputs: Mapping[str, Any], *, query_id: str | None = None, arrival: float | None = None
    ) -> dict[str, Any]:
        return await evaluate(graph, inputs, self._engines, query_id or "q0")

    def add_hook(self, hook: RuntimeHook) -> None:
        self._hooks.append(hook)


def make_runtime(
    engines: EngineSet, backend: str = DEFAULT_BACKEND, policy: str = "topology", timeouts: Timeouts | None = None
) -> Runtime:
    """A fresh runtime of the named backend over `engines`. `timeouts`: the local backend's
    deadlines (`Timeouts`; default 600 s for engine batches and user steps)."""
    if backend == "reference":
        return ReferenceRuntime(engines)
    if backend == "local":
        from teola_core.runtime.local import LocalRuntime

        return LocalRuntime(engines, policy=policy, timeouts=timeouts)
    if backend == "ray":  # each engine copied into one Ray actor; Ray connects as `RAY_ADDRESS` says
        from teola_core.runtime.ray import RayRuntime
        from teola_core.runtime.ray_pool import ray_engines

        return RayRuntime(lambda: ray_engines(engines), policy=policy, own_engines=True)
    raise ValueError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")


class RuntimePerLoop:
    """One runtime per event loop, created on first use there.

    Runtimes hold loop-bound futures and queues, so a drop-in object that is called from
    several loops (the caller's, its own sync thread's, a server's) keeps one each.
    `hooks` are added to every runtime it creates; `timeouts` (a `Timeouts`, or seconds for
    engines and steps alike) set the deadlines of each: what `optimize(..., timeout=)` passes.
    """

    def __init__(
        self,
        engines: EngineSet,
        backend: str = DEFAULT_BACKEND,
        policy: str = "topology",
        hooks: Sequence[Any] = (),
        timeouts: Timeouts | float | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
        self.engines = engines
        self.backend = backend
        self.policy = policy
        self.hooks = tuple(hooks)
        self.timeouts = Timeouts.of(timeouts)
        self._runtimes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Runtime] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def current(self) -> Runtime:
        """The running loop's runtime (must be called on a running loop)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            runtime = self._runtimes.get(loop)
            if runtime is None:
                runtime = self._runtimes[loop] = make_runtime(self.engines, self.backend, self.policy, self.timeouts)
                for hook in self.hooks:
                    runtime.add_hook(hook)
            return runtime

    @property
    def engine_names(self) -> tuple[str, ...]:
        return tuple(sorted(self.engines.engines))
