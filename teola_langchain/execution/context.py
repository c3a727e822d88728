"""One query's LangChain state: the caller's config and context, and the runs it has open.

A traced graph is shared by every query; what differs per query travels in a
`QueryContext`: user steps get it on the graph input "context", engines on
`Call.context` (`Runtime.run(..., context=ctx)`).

Every step of the original chain runs with the config LangChain would give it. A step
names where that config comes from with a `StepRef`: the composite run it belongs to
(`scope`, the id of an open run, or None for the chain's caller), the callback tag that
composite gives its children (`seq:step:2`, `map:key:context`, ...) and the configs of
the `RunnableBinding`s around it (`bound`, innermost first). `step_config` computes it
exactly as the composite does: `patch_config(run.config, callbacks=run.manager.get_child(tag))`,
then `merge_configs(*bound, ...)` as `RunnableBinding._merge_configs` nests them.

    ctx = QueryContext("q1", ensure_config(config), sync=True, caller=contextvars.copy_context())
    config = ctx.step_config(StepRef("seq", "seq:step:2"))
"""

from __future__ import annotations

import contextvars
from collections import ChainMap
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from uuid import uuid4

from langchain_core.callbacks import BaseCallbackManager
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import _set_config_context, merge_configs, patch_config

from teola_langchain.execution.batching import BatchGroup
from teola_langchain.execution.deferred_callbacks import (
    CallbackRecorder,
    is_recording,
    recording,
    records_only,
    without_tracing,
)

BoundConfigs = tuple[RunnableConfig, ...]
NOT_REACHED: Any = object()  # a deferred run's input before the chain reaches it


@dataclass(frozen=True)
class StepRef:
    """Where a step's config comes from (see the module docstring)."""

    scope: str | None = None
    tag: str | None = None
    bound: BoundConfigs = ()
    barrier: int | None = None  # a top-level step whose own `batch` a batch() call must use (`batching.py`)

    def within(self, bound: Sequence[RunnableConfig]) -> StepRef:
        """The same step seen through more bindings (outer ones come last)."""
        return replace(self, bound=(*bound, *self.bound)) if bound else self


@dataclass(eq=False)
class Deferred:
    """A run opened before the chain reached it: its callbacks go to `recorder` until then.

    live: the callback manager it was opened under (whose handlers get the recording);
    placeholder: the input it was opened with, swapped for `input` (its real input, set
    when the chain reaches it; `NOT_REACHED` until then) when the recording is handed on.
    """

    recorder: CallbackRecorder
    live: Any
    placeholder: Any
    input: Any = field(default_factory=lambda: NOT_REACHED)

    @property
    def reached(self) -> bool:
        return self.input is not NOT_REACHED


@dataclass
class OpenRun:
    """A composite's callback run, open while its children run.

    config: the config the composite runs with (LangChain's `ensure_config(config)`, its
    `run_id` popped), from which its children's configs derive. manager: its run manager
    (sync or async, as the caller's method). parent: the scope it was opened in.
    """

    manager: Any
    config: RunnableConfig
    parent: str | None
    kind: str = "chain"  # or "retriever": which `on_*_end` / `on_*_error` the manager has
    deferred: Deferred | None = None  # opened before the chain reached it (`runs.open_run(streaming=True)`)
    # A retriever sets no context of its own: its calls see the config its caller's context
    # holds (`QueryContext.context_config`; None: the caller's context as it is).
    context: RunnableConfig | None = None

    def end(self, output: Any) -> Any:
        return getattr(self.manager, f"on_{self.kind}_end")(output)

    def error(self, error: BaseException) -> Any:
        return getattr(self.manager, f"on_{self.kind}_error")(error)


@dataclass(eq=False)
class EarlyRun:
    """A step running before the chain reaches it (`tracing/early_steps.py`): its callbacks go to
    `recorder`, its input is `projection` (the keys it reads), and `read_failed` says that
    a part given the projection raised (the step then runs again, in order, on its real input)."""

    recorder: CallbackRecorder
    projection: Any
    read_failed: bool = False


@dataclass
class QueryContext:
    """One query's config, mode and open runs (see the module docstring).

    sync: the caller used a sync method, so steps take their sync path (`invoke`) in
    worker threads, as LangChain's sync methods do; otherwise `ainvoke` on the loop.
    caller: the caller's `contextvars.Context`, copied at the call; every step runs in a
    fresh copy of it, as every step of the original runs in its caller's context.
    root_run: a run the caller already opened for the graph's root composite (batch).
    arrival: the call's arrival on the runtime's clock; nested queries (a map's elements, a
    step started early) keep it, so engines serve them as part of the call they belong to.
    batch, batch_index, step: a `batch()` over a sequence (`batching.py`).
    """

    query_id: str
    config: RunnableConfig
    sync: bool
    caller: contextvars.Context
    runtime: Any = None
    runs: MutableMapping[str, OpenRun] = field(default_factory=dict)
    root_run: OpenRun | None = None
    batch: BatchGroup | None = None  # the batch() call this query is input `batch_index` of
    batch_index: int = 0
    step: int = 0  # the top-level step of a sequence this query has reached (batch errors)
    early: EarlyRun | None = None  # set while a step runs early: its callbacks are recorded
    arrival: float | None = None  # when the call began (the runtime's clock): its nested queries' too

    def step_config(self, ref: StepRef) -> RunnableConfig:
        """The config LangChain passes to the step `ref` names.

        A retriever hands its children only its run's callbacks (`{"callbacks":
        run_manager.get_child()}`, as the multi-query retriever does); a composite
        patches its own config. Bindings merge in the context their caller set up, as
        `RunnableBinding` does (`merge_configs` fills absent keys from the context's config).
        """
        if ref.scope is None:
            config = RunnableConfig(**self.config)
        else:
            run = self.runs[ref.scope]
            child = run.manager.get_child(ref.tag)
            if self.early is not None and not is_recording(child, self.early.recorder):
                child = recording(child, self.early.recorder)
            retriever = run.kind == "retriever"
            config = RunnableConfig(callbacks=child) if retriever else patch_config(run.config, callbacks=child)
        if not ref.bound:
            return config
        return self.step_context(config, replace(ref, bound=())).run(merge_configs, *ref.bound, config)

    def step_context(self, config: RunnableConfig, ref: StepRef) -> contextvars.Context:
        """A fresh copy of the caller's context, set up as the step's composite sets it up.

        A composite sets the step's `config` as the context's config; a retriever runs its
        children in its own caller's context (`context_config`); the chain's own root runs in
        the caller's context as is.
        """
        context = self.caller.copy()
        callbacks = config.get("callbacks")
        if self.early is not None or (isinstance(callbacks, BaseCallbackManager) and records_only(callbacks)):
            context.run(without_tracing)  # the recorder stands for the handlers, LangSmith's tracer among them
        if ref.scope is not None:
            run = self.runs[ref.scope]
            if run.kind != "retriever":
                context.run(_set_config_context, config)
            elif run.context is not None:
                context.run(_set_config_context, run.context)
        elif ref.bound:
            context.run(_set_config_context, config)
        return context

    def context_config(self, ref: StepRef) -> RunnableConfig | None:
        """The config the context holds where the step `ref` names is called, as LangChain sets it.

        A composite sets its child's config (`patch_config(...)`, before the bindings
        around the child merge theirs: a binding sets no context); a retriever sets none, so
        its calls see what its own caller's context holds. None: the caller's context as it is.
        A retriever run keeps this (`OpenRun.context`) for the calls it makes.
        """
        if ref.scope is None:
            return None
        run = self.runs[ref.scope]
        if run.kind == "retriever":
            return run.context
        return self.step_config(replace(ref, bound=()))

    def own_runs(self) -> MutableMapping[str, OpenRun]:
        """The runs this query opened (a map element's, not those around the map)."""
        return self.runs.maps[0] if isinstance(self.runs, ChainMap) else self.runs

    def running_early(self, projection: Any) -> QueryContext:
        """A context for a step that runs before the chain reaches it, on `projection` (`tracing/early_steps.py`)."""
        return replace(self.child(), early=EarlyRun(CallbackRecorder(), projection))

    def child(self) -> QueryContext:
        """A context for a nested query (one element of a map): its own id and runs.

        Its steps still see the runs open around the map (the map's own run included).
        """
        return replace(
            self,
            query_id=f"{self.query_id}/{uuid4().hex[:12]}",
            runs=ChainMap({}, self.runs),
            root_run=None,
            batch=None,
        )


def now_on(runtime: Any) -> float | None:
    """The runtime's clock now (None for a runtime without one: it then times queries itself)."""
    now = getattr(runtime, "now", None)
    return now() if callable(now) else None
