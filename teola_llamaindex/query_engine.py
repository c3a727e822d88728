"""Any LlamaIndex query engine on Teola: `RetrieverQueryEngine` traced, others as one step.

    fast = teola.optimize(index.as_query_engine())
    str(fast.query("why?")) == str(engine.query("why?"))    # spans, events, callbacks too

`query`/`aquery` are LlamaIndex's own (the query span, `QueryStartEvent`/`QueryEndEvent`,
the callback trace) on a view of the engine (`views`) whose `_query`/`_aquery` runs the
traced graph: the retriever, each node postprocessor and the synthesizer as primitives
that call them exactly as `RetrieverQueryEngine._query` does, in its span. Any other
query engine (a subclass included: it may override `_query`) runs as itself, as the one
step of a graph, with the `RetrieverQueryEngine`s it holds (a router's, a tool's) traced
(`nested`). Everything else (`retrieve`, `synthesize`, attributes) is the original's.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llama_index.core.instrumentation as instrument
from llama_index.core.callbacks.schema import CBEventType, EventPayload
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import QueryBundle

from teola_core.explain import section
from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.graph import Graph
from teola_llamaindex.common import OpaqueModuleWarning
from teola_llamaindex.dropin import LlamaIndexDropIn, weak_drop_in
from teola_llamaindex.nested import with_traced_parts
from teola_llamaindex.registry import EngineRegistry
from teola_llamaindex.rerank import reranks, trace_rerank
from teola_llamaindex.retrievers import trace_retriever
from teola_llamaindex.scope import QueryContext
from teola_llamaindex.synthesis import trace_synthesis, trace_warmup, warmup_prefix, why_opaque
from teola_llamaindex.views import framework_view


def trace_query_engine(
    engine: RetrieverQueryEngine, engines: EngineRegistry, *, decompose: bool | None = None
) -> Graph:
    """`RetrieverQueryEngine._query`'s body as a graph with inputs `query` (a bundle) and `context`."""
    b = GraphBuilder("RetrieverQueryEngine")
    ctx = b.input("context")
    query = b.input("query")
    retriever = engine.retriever
    with b.module(f"retriever:{type(retriever).__name__}"):
        nodes = trace_retriever(b, engines, retriever, query, ctx, decompose=decompose)
    for i, postprocessor in enumerate(engine._node_postprocessors):
        with b.module(f"postprocessor{i}:{type(postprocessor).__name__}"):
            if reranks(postprocessor):
                rerank_engine = engines.reranker(postprocessor)
                nodes = trace_rerank(b, rerank_engine, postprocessor, query, nodes, ctx, call="bundle")
            else:
                nodes = b.call(_postprocess(postprocessor), {"nodes": nodes, "query": query, "ctx": ctx}, name="run")
    synthesizer = engine._response_synthesizer
    with b.module(f"synthesizer:{type(synthesizer).__name__}"):
        inputs: dict[str, Value] = {"nodes": nodes, "query": query, "ctx": ctx}
        if decompose and why_opaque(synthesizer) is None:
            query_str = b.call(_query_str, {"query": query}, name="query_str", inline=True)
            response = trace_synthesis(
                b, engines, synthesizer, query_str, nodes, lambda: b.call(_synthesize(synthesizer), inputs, name="run")
            )
        else:
            if (prefix := warmup_prefix(engines, synthesizer)) is not None:
                query_str = b.call(_query_str, {"query": query}, name="query_str", inline=True)
                inputs["warm"] = trace_warmup(b, engines, synthesizer, prefix, query_str)
            response = b.call(_synthesize(synthesizer), inputs, name="run")
    b.output(response=response)
    return b.build(chain_modules=False)


def _query_str(query: QueryBundle) -> str:
    return query.query_str


def _postprocess(postprocessor: Any) -> Callable[..., Any]:
    async def run(nodes: Any, query: QueryBundle, ctx: QueryContext) -> Any:
        return await ctx.call(
            postprocessor.postprocess_nodes, postprocessor.apostprocess_nodes, nodes, query_bundle=query
        )

    return run


def _synthesize(synthesizer: Any) -> Callable[..., Any]:
    async def run(nodes: Any, query: QueryBundle, ctx: QueryContext, warm: Any = None) -> Any:
        return await ctx.call(synthesizer.synthesize, synthesizer.asynthesize, query=query, nodes=nodes)

    return run


class TeolaQueryEngine(LlamaIndexDropIn):
    """`query`/`aquery` of any LlamaIndex query engine, on Teola (see the module docstring).

    Options as for `LlamaIndexDropIn`. Concurrent `aquery` calls (and `query` calls from
    several threads) share engine schedulers.
    """

    def __init__(self, engine: Any, **options: Any) -> None:
        super().__init__(engine, **options)
        self.traced = type(engine) is RetrieverQueryEngine
        self.parts: list[TeolaQueryEngine] = []  # RetrieverQueryEngines inside an engine run as itself
        if not self.traced:
            part_options = {**options, **self.part_options()}
            try:
                self._target, found = with_traced_parts(engine, lambda part: self._trace_part(part, part_options))
                self.place_traced(self.parts)
            except BaseException:
                for part in self.parts:
                    part.close()
                raise
            inside = f"; the {found} RetrieverQueryEngine(s) inside it are traced" if found else ""
            warnings.warn(
                f"teola: {type(engine).__name__} runs as itself, one opaque step{inside} "
                "(teola traces RetrieverQueryEngine)",
                OpaqueModuleWarning,
                stacklevel=3,
            )
            return
        self.pgraph = trace_query_engine(engine, self._engines, decompose=self.decompose)
        self.graph, self.passes = self.optimize_graph(self.pgraph)
        self.place_traced()
        self._view = framework_view(engine, **_query_hooks(self))

    def _trace_part(self, engine: RetrieverQueryEngine, options: dict[str, Any]) -> RetrieverQueryEngine:
        part = TeolaQueryEngine(engine, **options)
        self.parts.append(part)
        return part._view

    def close(self) -> None:
        super().close()
        for part in self.parts:
            part.close()

    def plan_sections(self, png_dir: str | Path | None = None) -> list[str]:
        """The p-graph, the passes applied and the e-graph with Mermaid (PNG with `png_dir`), or
        why the engine runs as itself and the plans of the engines traced inside it."""
        title = f"Teola plan for a {type(self.original).__name__}\n"
        if not self.traced:
            parts = [
                f"- traced part {i} (RetrieverQueryEngine):\n{part.explain(png_dir)}"
                for i, part in enumerate(self.parts)
            ]
            how = section("execution", f"{type(self.original).__name__}: runs as itself, one opaque step")
            return [title, how, *parts]
        synthesizer = self.original._response_synthesizer
        why = why_opaque(synthesizer) if self.decompose else "without decompose=True"
        how = f"synthesizer {type(synthesizer).__name__}: " + (f"one call ({why})" if why else "plan + format + llm")
        sections = self.explain_sections("query", self.pgraph, self.graph, self.passes, png_dir)
        return [title, section("execution", how), *sections]

    def query(self, str_or_query_bundle: str | QueryBundle) -> Any:
        if not self.traced:
            return self.call_opaque(self._target.query, str_or_query_bundle)
        return self._view.query(str_or_query_bundle)

    async def aquery(self, str_or_query_bundle: str | QueryBundle) -> Any:
        if not self.traced:
            return await self.acall_opaque(self._target.aquery, str_or_query_bundle)
        return await self._view.aquery(str_or_query_bundle)

    async def _answer(self, query: QueryBundle, ctx: QueryContext) -> Any:
        return (await self.run_graph(self.graph, {"query": query}, ctx))["response"]


def _query_hooks(fast: TeolaQueryEngine) -> dict[str, Any]:
    """`_query`/`_aquery` as `RetrieverQueryEngine` has them (span, QUERY callback event), on the graph."""
    dispatcher = instrument.get_dispatcher(RetrieverQueryEngine.__module__)
    drop_in = weak_drop_in(fast)

    def _query(self: RetrieverQueryEngine, query_bundle: QueryBundle) -> Any:
        payload = {EventPayload.QUERY_STR: query_bundle.query_str}
        with self.callback_manager.event(CBEventType.QUERY, payload=payload) as query_event:
            response = drop_in().run_sync(lambda ctx: drop_in()._answer(query_bundle, ctx))
            query_event.on_end(payload={EventPayload.RESPONSE: response})
        return response

    async def _aquery(self: RetrieverQueryEngine, query_bundle: QueryBundle) -> Any:
        payload = {EventPayload.QUERY_STR: query_bundle.query_str}
        with self.callback_manager.event(CBEventType.QUERY, payload=payload) as query_event:
            response = await drop_in()._answer(query_bundle, QueryContext(sync=False))
            query_event.on_end(payload={EventPayload.RESPONSE: response})
        return response

    return {"_query": dispatcher.span(_query), "_aquery": dispatcher.span(_aquery)}
