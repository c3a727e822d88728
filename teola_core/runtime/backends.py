"""Choosing where an optimized app's graphs run, by name.

Backends (`make_runtime`): "local" (the default) is
`teola_core.runtime.local.LocalRuntime`, the scheduled, batching runtime; "ray"
(`teola_core.runtime.ray.RayRuntime`) runs each engine as a pool of Ray actors;
"reference" runs each query with `teola_core.runtime.reference.evaluate` (one
primitive at a time; it defines what a graph computes), useful to check a result.

The drop-in objects keep a `RuntimePerLoop`: on "ray" it places the engines once
(`RayEngines`, from the `ray=` option, checked when it is built) and every loop's
runtime shares those actors.

    runtimes = RuntimePerLoop(engines, "ray", ray={"engines": {"llm": {"num_gpus": 1}}})
    answer = await runtimes.current().run(graph, inputs)
    runtimes.close()                      # kills the actors (Ray stays connected)
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from teola_core.engines.protocol import EngineSet
from teola_core.ir.graph import Graph
from teola_core.runtime.base import Runtime, RuntimeHook
from teola_core.runtime.per_loop import PerLoop
from teola_core.runtime.reference import evaluate
from teola_core.runtime.timeouts import Timeouts

if TYPE_CHECKING:
    from teola_core.runtime.ray import RayEngines
    from teola_core.runtime.ray.options import RayOptions

BACKENDS = ("reference", "local", "ray")
DEFAULT_BACKEND = "local"


class ReferenceRuntime(Runtime):
    """The `Runtime` interface over the reference evaluator (no scheduling, no spans)."""

    def __init__(self, engines: EngineSet) -> None:
        self._engines = engines
        self._hooks: list[RuntimeHook] = []

    async def run(
        self,
        graph: Graph,
        inputs: Mapping[str, Any],
        *,
        query_id: str | None = None,
        arrival: float | None = None,
        context: Any = None,
    ) -> dict[str, Any]:
        return await evaluate(graph, inputs, self._engines, query_id or "q0", context)

    def add_hook(self, hook: RuntimeHook) -> None:
        self._hooks.append(hook)


def make_runtime(
    engines: EngineSet | RayEngines,
    backend: str = DEFAULT_BACKEND,
    policy: str = "topology",
    *,
    ray: RayOptions | Mapping[str, Any] | None = None,
    timeouts: Timeouts | float | None = None,
    **scheduling: Any,
) -> Runtime:
    """A fresh runtime of the named backend over `engines`: the one place runtimes are made.

    On "ray", `engines` may be a shared `RayEngines` placement (then `ray` must be None);
    otherwise the runtime places them itself as `ray` says, and `close()` kills its actors.
    `timeouts`: the deadlines of engine batches and user steps (`Timeouts`; default 600 s).
    `scheduling`: what the scheduled backends ("local", "ray") take besides, e.g. `depth_cost`
    (a workflow step's depth) or `clock` (the agents' clock); the reference evaluator
    schedules nothing, so it takes none.
    """
    check_backend(backend, ray)
    if backend == "ray":
        from teola_core.runtime.ray import RayRuntime

        runtime = RayRuntime(engines, policy, ray=ray, **scheduling)
        runtime.timeouts = Timeouts.of(timeouts)
        return runtime
    if not isinstance(engines, EngineSet):
        raise TypeError(f"backend {backend!r} runs an EngineSet, not {type(engines).__name__}")
    if backend == "reference":
        if scheduling:
            raise TypeError(f"backend 'reference' schedules nothing: it takes no {', '.join(sorted(scheduling))}")
        return ReferenceRuntime(engines)
    from teola_core.runtime.local import LocalRuntime

    return LocalRuntime(engines, policy=policy, timeouts=Timeouts.of(timeouts), **scheduling)


def check_backend(backend: str, ray: object) -> None:
    """Fail on an unknown backend, or on `ray=` options for another backend than "ray"."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
    if ray is not None and backend != "ray":
        raise ValueError(f"ray= options need backend='ray' (backend is {backend!r})")


class RuntimePerLoop:
    """One runtime per event loop, created on first use there.

    Runtimes hold loop-bound futures and queues, so a drop-in object that is called from
    several loops (the caller's, its own sync thread's, a server's) keeps one each.
    `hooks` are added to every runtime it creates (and `add_hook` adds one to all, made and
    to come); `timeouts` (a `Timeouts`, or seconds for engines and steps alike) set the
    deadlines of each: what `optimize(..., timeout=)` passes; `scheduling`: `make_runtime`'s.
    On the "ray" backend the engines are placed once, here (`ray`: the `ray=` option,
    checked now), and every loop's runtime shares those actors; `close()` (or garbage
    collection) kills them, and a later call starts fresh ones (as a drop-in's sync thread
    restarts after `close()`).
    """

    def __init__(
        self,
        engines: EngineSet,
        backend: str = DEFAULT_BACKEND,
        policy: str = "topology",
        hooks: Sequence[Any] = (),
        *,
        ray: RayOptions | Mapping[str, Any] | None = None,
        timeouts: Timeouts | float | None = None,
        **scheduling: Any,
    ) -> None:
        check_backend(backend, ray)
        self.engines = engines
        self.backend = backend
        self.policy = policy
        self.timeouts = Timeouts.of(timeouts)
        self._scheduling = scheduling
        self._runtimes: PerLoop[Runtime] = PerLoop()
        for hook in hooks:
            self.add_hook(hook)
        self._lock = threading.Lock()
        self._ray = ray
        self.placed: RayEngines | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        if backend == "ray":
            self._place()

    def _place(self) -> None:
        from teola_core.runtime.ray import RayEngines

        self.placed = RayEngines(self.engines, self._ray)
        self._finalizer = weakref.finalize(self, self.placed.close)

    def current(self) -> Runtime:
        """The running loop's runtime (must be called on a running loop)."""
        with self._lock:
            if self.placed is not None and self.placed.closed:  # closed: start afresh
                self._runtimes.clear()
                self._place()
        return self._runtimes.current(self._make)

    def _make(self) -> Runtime:
        return make_runtime(
            self.placed or self.engines, self.backend, self.policy, timeouts=self.timeouts, **self._scheduling
        )

    def add_hook(self, hook: RuntimeHook) -> None:
        """Observe every primitive of every runtime, the ones made so far and the ones to come."""
        # The setup holds `hook`, not self: the PerLoop keeps it, and self holds the PerLoop.
        self._runtimes.apply_to_all(lambda runtime: runtime.add_hook(hook))

    def pop_current(self) -> Runtime | None:
        """Forget the running loop's runtime and return it (None if it had none), to close it."""
        return self._runtimes.pop_current()

    def where(self) -> dict[str, str]:
        """Per engine, where it runs ("driver", or its Ray actors and what each reserves)."""
        if self.placed is None:
            return dict.fromkeys(self.engines.engines, "driver")
        return self.placed.where()

    def close(self) -> None:
        """Kill the Ray actors of the engines (if any); a later call starts new ones."""
        if self._finalizer is not None:
            self._finalizer()
