"""The spans of QueryPipeline's async executor, which Teola's graph replaces: `run_jobs` and `worker`.

    spans = WaveSpans(scope, plan.waves)     # one per async run, inside `_arun_multi`'s span
    module_scope = spans.begin("llm")        # `run_jobs` of its wave (on first use), its `worker`
    spans.end("llm", output)                 # the worker exits; the wave's `run_jobs` after its last

`_arun_multi` runs each wave of modules through `run_jobs`, one `worker` span per module,
and plain LlamaIndex users see those spans. Teola starts each module when its own inputs
are ready instead, so it opens the same spans itself, with the same names, parents and
dispatcher: a wave's `run_jobs` when its first module starts, closed when every module
of the wave has run or been skipped. Their arguments list no coroutines (Teola has none).
"""

from __future__ import annotations

import contextvars
import inspect
import uuid
from collections import Counter
from collections.abc import Mapping
from typing import Any

import llama_index.core.instrumentation as instrument
from llama_index.core.async_utils import run_jobs
from llama_index.core.instrumentation.dispatcher import active_instrument_tags
from llama_index.core.instrumentation.events.span import SpanDropEvent
from llama_index.core.instrumentation.span import active_span_id

_DISPATCHER = instrument.get_dispatcher(run_jobs.__module__)
_RUN_JOBS = "run_jobs"
_WORKER = "run_jobs.<locals>.worker"
_RUN_JOBS_ARGS = inspect.signature(run_jobs).bind([])


def _worker(job: Any) -> Any:  # the signature of `run_jobs`' inner `worker`
    return job


_WORKER_ARGS = inspect.signature(_worker).bind(None)


class WaveSpans:
    """One async run's `run_jobs` / `worker` spans (see the module docstring)."""

    def __init__(self, scope: contextvars.Context, waves: Mapping[str, int]) -> None:
        self._scope = scope
        self._waves = waves
        self._unresolved = Counter(waves.values())  # modules per wave not run or skipped yet
        self._run_jobs: dict[int, tuple[str, contextvars.Context]] = {}  # wave -> (span id, its scope)
        self._workers: dict[str, str] = {}  # module -> its open worker span

    def begin(self, module: str) -> contextvars.Context:
        """Open the module's worker span (and its wave's `run_jobs`); the scope the module runs in."""
        wave = self._waves[module]
        if wave not in self._run_jobs:
            self._run_jobs[wave] = self._enter(_RUN_JOBS, _RUN_JOBS_ARGS, self._scope)
        worker, scope = self._enter(_WORKER, _WORKER_ARGS, self._run_jobs[wave][1])
        self._workers[module] = worker
        return scope

    def end(self, module: str, result: Any) -> None:
        """The module ran (`result`) or was skipped (it had no worker): close what is done."""
        worker = self._workers.pop(module, None)
        if worker is not None:
            _DISPATCHER.span_exit(id_=worker, bound_args=_WORKER_ARGS, instance=None, result=result)
        wave = self._waves[module]
        self._unresolved[wave] -= 1
        if self._unresolved[wave] == 0 and wave in self._run_jobs:
            span, _ = self._run_jobs.pop(wave)
            _DISPATCHER.span_exit(id_=span, bound_args=_RUN_JOBS_ARGS, instance=None, result=None)

    def fail(self, error: BaseException) -> None:
        """The run failed: drop the spans still open, workers first, as the executor's would be."""
        open_spans = [(w, _WORKER_ARGS) for w in self._workers.values()]
        open_spans += [(span, _RUN_JOBS_ARGS) for span, _ in self._run_jobs.values()]
        self._workers.clear()
        self._run_jobs.clear()
        for span, args in open_spans:
            _DISPATCHER.event(SpanDropEvent(span_id=span, err_str=str(error)))
            _DISPATCHER.span_drop(id_=span, bound_args=args, instance=None, err=error)

    @staticmethod
    def _enter(name: str, args: inspect.BoundArguments, parent: contextvars.Context) -> tuple[str, contextvars.Context]:
        span = f"{name}-{uuid.uuid4()}"
        scope = parent.copy()
        parent_span = scope.run(active_span_id.get)
        tags = scope.run(active_instrument_tags.get)
        _DISPATCHER.span_enter(id_=span, bound_args=args, instance=None, parent_id=parent_span, tags=tags)
        scope.run(active_span_id.set, span)
        return span, scope
