"""A `QueryPipeline` (llama-index-core <= 0.12) run on Teola with the pipeline's own call surface.

    fast = teola.optimize(pipeline)              # or TeolaQueryPipelineExecutor(pipeline)
    fast.run(topic="cats") == pipeline.run(topic="cats")
    await fast.arun(input=["a", "b"], batch=True)

Every method is QueryPipeline's own (its spans, callback trace and QUERY event, the
callback manager it sets on the modules, batching, intermediates) on a view of the
pipeline (`views`) whose executor loop, `_run_multi` / `_arun_multi`, runs the traced
graph (`pipeline_trace`): each primitive starts when its own inputs are ready, and
concurrent runs share engine schedulers. A pipeline that cannot be traced runs as
itself, the one step of a graph (a warning says why).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import llama_index.core.instrumentation as instrument
from llama_index.core.base.query_pipeline.query import ComponentIntermediates
from llama_index.core.query_pipeline import QueryPipeline

from teola_core.explain import section
from teola_llamaindex.common import OpaqueModuleWarning
from teola_llamaindex.dropin import LlamaIndexDropIn, weak_drop_in
from teola_llamaindex.executor_spans import WaveSpans
from teola_llamaindex.pipeline_trace import PipelinePlan, UnsupportedPipeline, trace_pipeline
from teola_llamaindex.scope import QueryContext
from teola_llamaindex.views import framework_view

Outputs = tuple[dict[str, Any], dict[str, ComponentIntermediates]]


class TeolaQueryPipelineExecutor(LlamaIndexDropIn):
    """Runs a `QueryPipeline` on Teola (see the module docstring).

    Options as for `LlamaIndexDropIn`, and warn (warn once for each opaque module). Sync
    methods run the graph on an event loop this object owns in a daemon thread, the
    modules' own sync code on the calling thread; async methods run on the caller's loop.
    """

    def __init__(self, pipeline: QueryPipeline, *, warn: bool = True, **options: Any) -> None:
        super().__init__(pipeline, **options)
        self.plan: PipelinePlan | None = None
        self.fallback: str | None = None
        try:
            self.plan = trace_pipeline(pipeline, self._engines, warn=warn, decompose=self.decompose)
        except UnsupportedPipeline as exc:
            self.fallback = str(exc)
            warnings.warn(f"teola: this QueryPipeline runs as itself ({exc})", OpaqueModuleWarning, stacklevel=2)
            self.place_traced()
            return
        self.plan.graph, self.plan.passes = self.optimize_graph(self.plan.pgraph)
        self.place_traced()
        self._view = framework_view(pipeline, **_executor_hooks(self))

    def plan_sections(self, png_dir: str | Path | None = None) -> list[str]:
        """What was traced into what (p-graph, passes, e-graph with Mermaid; PNG with
        `png_dir`), or why the pipeline runs as itself."""
        if self.plan is None:
            return [f"QueryPipeline runs as itself: {self.fallback}\n"]
        plan = self.plan
        return [
            "Teola plan for a QueryPipeline\n",
            section("opaque modules", "\n".join(f"- {m}" for m in plan.opaque) or "- none"),
            *self.explain_sections("pipeline", plan.pgraph, plan.graph, plan.passes, png_dir),
        ]

    async def _multi(self, module_inputs: dict[str, Any], show_intermediates: bool, ctx: QueryContext) -> Outputs:
        assert self.plan is not None
        spans = None if ctx.sync else WaveSpans(ctx.scope, self.plan.waves)  # async: the executor's spans
        try:
            out = await self.run_graph(self.plan.graph, {"inputs": module_inputs, "spans": spans}, ctx)
        except BaseException as exc:
            if spans is not None:
                spans.fail(exc)
            raise
        collected = out["result"]
        outputs, intermediates = self.plan.compose(collected["outs"], collected["ins"], sync=ctx.sync)
        return outputs, intermediates if show_intermediates else {}

    # -- QueryPipeline's own methods, on the view (or as one opaque step) --------------------
    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self.plan is None:
            return self.call_opaque(getattr(self.original, method), *args, **kwargs)
        return getattr(self._view, method)(*args, **kwargs)

    async def _acall(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self.plan is None:
            return await self.acall_opaque(getattr(self.original, method), *args, **kwargs)
        return await getattr(self._view, method)(*args, **kwargs)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("run", *args, **kwargs)

    async def arun(self, *args: Any, **kwargs: Any) -> Any:
        return await self._acall("arun", *args, **kwargs)

    def run_with_intermediates(self, *args: Any, **kwargs: Any) -> Outputs:
        return self._call("run_with_intermediates", *args, **kwargs)

    async def arun_with_intermediates(self, *args: Any, **kwargs: Any) -> Outputs:
        return await self._acall("arun_with_intermediates", *args, **kwargs)

    def run_multi(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self._call("run_multi", *args, **kwargs)

    async def arun_multi(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return await self._acall("arun_multi", *args, **kwargs)

    def run_multi_with_intermediates(self, *args: Any, **kwargs: Any) -> Outputs:
        return self._call("run_multi_with_intermediates", *args, **kwargs)

    async def arun_multi_with_intermediates(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The outputs only, as LlamaIndex's own `arun_multi_with_intermediates` returns."""
        return await self._acall("arun_multi_with_intermediates", *args, **kwargs)


def _executor_hooks(fast: TeolaQueryPipelineExecutor) -> dict[str, Any]:
    """`_run_multi` / `_arun_multi` as QueryPipeline has them (a span, input validation), on the graph."""
    dispatcher = instrument.get_dispatcher(QueryPipeline.__module__)
    drop_in = weak_drop_in(fast)

    def _run_multi(self: QueryPipeline, module_input_dict: dict[str, Any], show_intermediates: bool = False) -> Outputs:
        self._validate_inputs(module_input_dict)
        return drop_in().run_sync(lambda ctx: drop_in()._multi(module_input_dict, show_intermediates, ctx))

    async def _arun_multi(
        self: QueryPipeline, module_input_dict: dict[str, Any], show_intermediates: bool = False
    ) -> Outputs:
        self._validate_inputs(module_input_dict)
        return await drop_in()._multi(module_input_dict, show_intermediates, QueryContext(sync=False))

    return {"_run_multi": dispatcher.span(_run_multi), "_arun_multi": dispatcher.span(_arun_multi)}
