"""What every drop-in object shares, whatever its framework: the engines it traced, one
runtime per event loop over them, the loop thread that serves its sync calls, and closing.

    class MyDropIn(DropInBase):
        def __init__(self, ...):
            self.runtimes = RuntimePerLoop(engines, backend, policy, hooks=[self.recent])
            self.start_sync_thread("teola:my-app")

`recent` keeps the last primitives every runtime ran, for `explain()`'s report of recent
runs and their timeline (`teola_core.explain.timeline_sections`).

`teola_langchain.runnable.TeolaRunnable` and `teola_llamaindex.dropin.LlamaIndexDropIn` are
built on it; each keeps only what is its framework's own (tracing, the call surface).
"""

from __future__ import annotations

import functools
import weakref
from pathlib import Path
from typing import Any

from teola_core.engines.protocol import EngineSet
from teola_core.explain import timeline_sections
from teola_core.runtime.backends import RuntimePerLoop
from teola_core.runtime.base import Runtime
from teola_core.runtime.loop_thread import LoopThread
from teola_core.runtime.timeline import RecentSpans


class DropInBase:
    """The engines, runtimes and sync thread of a drop-in object (see the module docstring)."""

    runtimes: RuntimePerLoop
    sync_thread: LoopThread

    @functools.cached_property
    def recent(self) -> RecentSpans:
        """The last primitives this object's runtimes ran (a hook of each of them)."""
        return RecentSpans()

    def explain_runs(self, png_dir: str | Path | None = None) -> list[str]:
        """`explain()`'s sections on what recent runs did on each engine (and their timeline)."""
        return timeline_sections(self.recent.spans(), png_dir)

    def start_sync_thread(self, name: str) -> None:
        """The loop thread of the sync methods, stopped when the object is collected."""
        self.sync_thread = LoopThread(name)
        self._sync_thread_finalizer: Any = weakref.finalize(self, self.sync_thread.close)

    def close(self) -> None:
        """Stop the event-loop thread of the sync methods and any Ray actors (both restart if used again)."""
        self.sync_thread.close()
        self.runtimes.close()

    @property
    def engine_set(self) -> EngineSet:
        """The engines the traced object runs on (as traced: before any Ray placement)."""
        return self.runtimes.engines

    @property
    def engine_names(self) -> tuple[str, ...]:
        """The names of the engines the traced object runs on."""
        return self.runtimes.engine_names

    def where(self) -> dict[str, str]:
        """Per engine, where it runs ("driver", or its Ray actors and what each reserves)."""
        return self.runtimes.where()

    def runtime_for_current_loop(self) -> Runtime:
        """The runtime that serves async calls made on the running event loop (one per loop)."""
        return self.runtimes.current()
