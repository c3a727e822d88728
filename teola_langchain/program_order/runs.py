"""The Teola side of an optimized object's runs (programs): one callback handler per run, ranked by start.

With a bound on model calls, runs on one event loop share a `ModelAdmission` (its engines
hold loop-bound futures): async runs use the caller's loop, sync runs the loop of a thread
this object owns (`LoopThread`), where their held calls are scheduled while LangGraph's
worker threads wait. Without one, a run's handler only counts its calls. With the bound
learned from the server ("auto", the default) async runs are gated and sync runs counted:
concurrent runs are what make a server's queue, and they come from async callers.

    runs = ProgramRuns("rag")
    gate = runs.open(asyncio.get_running_loop())   # a run starts: rank 0, 1, ... (None: a sync run)
    ...                                            # its model calls report to `gate`
    runs.close(gate)                               # it ended: its slots are free
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import weakref
from collections.abc import Sequence

from teola_core.runtime.base import RuntimeHook
from teola_core.runtime.loop_thread import LoopThread
from teola_core.runtime.per_loop import PerLoop, running_loop
from teola_core.runtime.timeline import RecentSpans
from teola_langchain.program_order.admission import AUTO, Concurrency, ModelAdmission, check_concurrency
from teola_langchain.program_order.gate import RunCalls, RunGate


class ProgramRuns:
    """Admissions per event loop, run ranks and counters of one optimized graph or chain.

    hooks: runtime hooks of every loop's admission; `recent`, the last model calls' spans
    for `explain()`, is one more.
    """

    def __init__(self, name: str, concurrency: Concurrency = AUTO, hooks: Sequence[RuntimeHook] = ()) -> None:
        check_concurrency(concurrency)
        self.name = name
        self.concurrency = concurrency
        self.recent = RecentSpans()
        self.hooks = (*hooks, self.recent)
        self.runs = 0  # runs started
        self.calls_on_graph = 0  # runs in which Teola admitted at least one model call
        self.model_calls = 0  # model calls admitted by Teola
        self._ranks = itertools.count()
        self._admissions: PerLoop[ModelAdmission] = PerLoop()
        self._lock = threading.Lock()
        self._thread = LoopThread(f"teola-graph:{name}")
        self._finalizer = weakref.finalize(self, self._thread.close)

    def add_hook(self, hook: RuntimeHook) -> None:
        """One more runtime hook, on every loop's admission (made so far and to come)."""
        self.hooks = (*self.hooks, hook)
        for admission in self._admissions.values():
            admission.add_hook(hook)

    def admission(self, loop: asyncio.AbstractEventLoop) -> ModelAdmission:
        return self._admissions.get(loop, self._new_admission)

    def _new_admission(self) -> ModelAdmission:
        return ModelAdmission(self.concurrency, self.hooks)

    def open(self, loop: asyncio.AbstractEventLoop | None) -> RunCalls:
        """A run starts on `loop` (async methods: the caller's; None: a sync method's)."""
        rank = next(self._ranks)
        with self._lock:
            self.runs += 1
        if self.concurrency is None or (self.concurrency == AUTO and loop is None):
            return RunCalls(f"run{rank}")
        if loop is None:  # the sync method's calls are scheduled on this object's own loop
            loop = self._thread.loop
        return RunGate(self.admission(loop), loop, rank, f"run{rank}")

    def close(self, gate: RunCalls) -> None:
        """The run ended (returned, raised, or its stream was closed)."""
        if isinstance(gate, RunGate):
            if running_loop() is gate.loop:
                gate.close()
            else:
                gate.loop.call_soon_threadsafe(gate.close)
        with self._lock:
            self.model_calls += gate.calls
            self.calls_on_graph += gate.calls > 0

    def engines(self) -> list[str]:
        """The model engines made so far, on every loop."""
        admissions = self._admissions.values()
        return sorted({name for a in admissions for name in a.engines()})

    def servers(self) -> list[str]:
        """What is known of the model servers read so far ("auto"), one line each."""
        return [line for a in self._admissions.values() for line in a.describe_servers()]

    def shutdown(self) -> None:
        """Stop the sync methods' loop thread (it restarts if used again)."""
        self._thread.close()
