"""The base of every object `teola.optimize` returns, whatever its framework.

    class TeolaThing(DropIn):
        def __init__(self, thing, *, backend="local", ray=None):
            self.original = thing
            engines = trace(thing)                       # the framework's own work
            self.place_engines(engines, backend=backend, ray=ray)
            self.start_sync_thread("teola:thing")        # if it has sync methods

        def plan_sections(self, png_dir=None):           # explain(): what is its own
            return ["Teola plan for a thing\\n", ...]

What every drop-in then has, alike: `original` (the user's object, untouched); one
runtime per event loop over its engines, made by the one factory
(`teola_core.runtime.backends.make_runtime`), so `backend="ray"` places its engines in Ray
actors whatever the framework; `runtime()`, the running loop's; `add_hook`; `where()`;
`explain()` (its own sections, then what recent runs did on each engine); `close()` /
`aclose()` and both context managers; and the original's other public attributes, forwarded
(private ones are the original's own business: `original` has them).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from teola_core.engines.protocol import EngineSet
from teola_core.explain import timeline_sections
from teola_core.runtime.backends import DEFAULT_BACKEND, RuntimePerLoop
from teola_core.runtime.base import RuntimeHook
from teola_core.runtime.loop_thread import LoopThread
from teola_core.runtime.timeline import RecentSpans
from teola_core.runtime.timeouts import Timeouts


class DropIn:
    """What every drop-in object shares (see the module docstring).

    `forwards_to`: the attribute holding the object whose other attributes this one
    answers with (the original, or the copy that runs); None: nothing is forwarded.
    """

    forwards_to: ClassVar[str | None] = "original"
    original: Any
    _sync_thread: LoopThread | None = None
    _runtimes: RuntimePerLoop | None = None

    # -- engines and runtimes ------------------------------------------------------------
    def place_engines(
        self,
        engines: EngineSet,
        *,
        backend: str = DEFAULT_BACKEND,
        policy: str = "topology",
        ray: Any = None,
        timeouts: Timeouts | float | None = None,
        hooks: Sequence[RuntimeHook] = (),
        **scheduling: Any,
    ) -> None:
        """After tracing: the runtimes over `engines` (on "ray", the engines placed as `ray` says);
        `hooks` and `recent` see every primitive they run."""
        self._runtimes = RuntimePerLoop(
            engines, backend, policy, (*hooks, self.recent), ray=ray, timeouts=timeouts, **scheduling
        )

    @property
    def runtimes(self) -> RuntimePerLoop:
        """The runtimes of the traced object (one per event loop; its engines' placement)."""
        if self._runtimes is None:
            raise RuntimeError(f"{type(self).__name__}.__init__ did not call place_engines() after tracing")
        return self._runtimes

    def runtime(self) -> Any:
        """What serves this object's calls on the running event loop (made on first use there)."""
        return self.runtimes.current()

    @property
    def engine_set(self) -> EngineSet:
        """The engines the traced object runs on (as traced: before any Ray placement)."""
        return self.runtimes.engines

    @property
    def engine_names(self) -> tuple[str, ...]:
        """The names of the engines the traced object runs on."""
        return tuple(sorted(self.engine_set.engines))

    def where(self) -> dict[str, str]:
        """Per engine, where it runs ("driver", or its Ray actors and what each reserves)."""
        return self.runtimes.where()

    # -- observing -----------------------------------------------------------------------
    @functools.cached_property
    def recent(self) -> RecentSpans:
        """The last primitives this object's runtimes ran (a hook of each of them)."""
        return RecentSpans()

    def add_hook(self, hook: RuntimeHook) -> None:
        """Observe every primitive of every run, on every loop's runtime."""
        self.runtimes.add_hook(hook)

    def explain(self, png_dir: str | Path | None = None) -> str:
        """The plan (this object's own sections), then what recent runs did on each engine.

        With `png_dir`, the graphs and the recent runs' timeline are also drawn as PNGs there.
        """
        return "\n".join([*self.plan_sections(png_dir), *self.explain_runs(png_dir)])

    def plan_sections(self, png_dir: str | Path | None = None) -> list[str]:
        """`explain()`'s sections on what this object runs and how (its title first)."""
        raise NotImplementedError(f"{type(self).__name__} does not say what it runs (plan_sections)")

    def explain_runs(self, png_dir: str | Path | None = None) -> list[str]:
        """`explain()`'s sections on what recent runs did on each engine (and their timeline)."""
        return timeline_sections(self.recent.spans(), png_dir)

    # -- sync calls and closing ------------------------------------------------------------
    def start_sync_thread(self, name: str) -> None:
        """The loop thread of the sync methods, stopped when the object is collected."""
        self._sync_thread = LoopThread(name)
        self._sync_thread_finalizer: Any = weakref.finalize(self, self._sync_thread.close)

    @property
    def sync_thread(self) -> LoopThread:
        """The loop thread of the sync methods (`start_sync_thread`)."""
        if self._sync_thread is None:
            raise RuntimeError(f"{type(self).__name__} has no sync methods' loop thread (start_sync_thread)")
        return self._sync_thread

    def close(self) -> None:
        """Stop the sync methods' loop thread and kill any Ray actors (both restart if used again)."""
        if self._sync_thread is not None:
            self._sync_thread.close()
        if self._runtimes is not None:
            self._runtimes.close()

    async def aclose(self) -> None:
        """Close the running loop's runtime (its batches end; the next call makes a fresh one), then `close()`."""
        if self._runtimes is not None:
            runtime = self._runtimes.pop_current()
            if runtime is not None:
                await runtime.close()
        self.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the original's other attributes ---------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        """The forwarded object's attribute (`forwards_to`), for what the drop-in does not define."""
        target = None if self.forwards_to is None else self.__dict__.get(self.forwards_to)
        if target is None or name.startswith("_"):  # before __init__ set it, or not the object's API
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(target, name)
