"""Trace a `RetrieverQueryEngine` (what `index.as_query_engine()` returns) and run it.

    from teola import optimize
    fast = optimize(index.as_query_engine())
    str(fast.query("why?")) == str(engine.query("why?"))

`RetrieverQueryEngine._query` is retrieve -> node postprocessors, in order -> response
synthesizer. Traced: the retriever as EMBED + SEARCH when it is a
`VectorIndexRetriever`, as query generation + per-query EMBED + SEARCH + fusion when it
is a `QueryFusionRetriever` over those (see `retrievers`; any other retriever is one
call); each reranking postprocessor as a RERANK primitive on its own engine and each
local filter as one call (see `rerank`: `postprocess_nodes(nodes, query_bundle=...)`, or
`apostprocess_nodes` in async queries); the synthesizer as plan + FORMAT + LLM
primitives for "compact", "simple_summarize" and single-chunk "refine" (see
`synthesis`), else as one call (`synthesize`/`asynthesize(query=bundle, nodes=nodes)`:
refine chains, tree_summarize, ...). A string query becomes `QueryBundle(query)` first,
as `BaseQueryEngine.query` does. Only the exact class is traced (a subclass may
override `_query`); `optimize` rejects others.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import QueryBundle

from teola_core.ir.builder import GraphBuilder
from teola_core.ir.errors import PrimitiveError
from teola_core.ir.graph import Graph
from teola_core.profiles.profile import LatencyProfile
from teola_core.runtime.backends import BACKENDS, DEFAULT_BACKEND, RuntimePerLoop
from teola_core.runtime.loop_thread import LoopThread
from teola_llamaindex.common import QueryContext, unwrap_error
from teola_llamaindex.engines import EngineRegistry
from teola_llamaindex.openai_compat import warmup_notes
from teola_llamaindex.optimizing import optimize_graph
from teola_llamaindex.rerank import reranks, trace_rerank
from teola_llamaindex.retrievers import trace_retriever, traceable
from teola_llamaindex.synthesis import trace_synthesis, why_opaque


def trace_query_engine(engine: RetrieverQueryEngine, engines: EngineRegistry) -> Graph:
    """The engine's `_query` as a graph with inputs `query` (a bundle) and `context`."""
    if type(engine) is not RetrieverQueryEngine:
        raise TypeError(f"teola traces RetrieverQueryEngine itself, not {type(engine).__name__}")
    b = GraphBuilder("RetrieverQueryEngine")
    ctx = b.input("context")
    query = b.input("query")
    retriever = engine.retriever
    with b.module(f"retriever:{type(retriever).__name__}"):
        if traceable(retriever):
            nodes = trace_retriever(b, engines, retriever, query, ctx)
        else:
            nodes = b.call(_retrieve(retriever), {"query": query, "ctx": ctx}, name="retrieve")
    for i, postprocessor in enumerate(engine._node_postprocessors):
        with b.module(f"postprocessor{i}:{type(postprocessor).__name__}"):
            if reranks(postprocessor):
                rerank_engine = engines.reranker(postprocessor)
                nodes = trace_rerank(b, rerank_engine, postprocessor, query, nodes, ctx, call="bundle")
            else:
                nodes = b.call(_postprocess(postprocessor), {"nodes": nodes, "query": query, "ctx": ctx}, name="run")
    synthesizer = engine._response_synthesizer
    with b.module(f"synthesizer:{type(synthesizer).__name__}"):
        inputs = {"nodes": nodes, "query": query, "ctx": ctx}
        if why_opaque(synthesizer) is None:
            query_str = b.call(_query_str, {"query": query}, name="query_str", inline=True)
            response = trace_synthesis(
                b, engines, synthesizer, query_str, nodes, lambda: b.call(_synthesize(synthesizer), inputs, name="run")
            )
        else:
            response = b.call(_synthesize(synthesizer), inputs, name="run")
    b.output(response=response)
    return b.build(chain_modules=False)


def _query_str(query: QueryBundle) -> str:
    return query.query_str


def _retrieve(retriever: Any) -> Callable[..., Any]:
    async def run(query: QueryBundle, ctx: QueryContext) -> Any:
        if ctx.sync:
            return await asyncio.to_thread(retriever.retrieve, query)
        return await retriever.aretrieve(query)

    return run


def _postprocess(postprocessor: Any) -> Callable[..., Any]:
    async def run(nodes: Any, query: QueryBundle, ctx: QueryContext) -> Any:
        if ctx.sync:
            return await asyncio.to_thread(postprocessor.postprocess_nodes, nodes, query_bundle=query)
        return await postprocessor.apostprocess_nodes(nodes, query_bundle=query)

    return run


def _synthesize(synthesizer: Any) -> Callable[..., Any]:
    async def run(nodes: Any, query: QueryBundle, ctx: QueryContext) -> Any:
        if ctx.sync:
            return await asyncio.to_thread(synthesizer.synthesize, query=query, nodes=nodes)
        return await synthesizer.asynthesize(query=query, nodes=nodes)

    return run


class TeolaQueryEngine:
    """`query`/`aquery` of a `RetrieverQueryEngine`, run on Teola (see the module docstring).

    Options as for `TeolaQueryPipelineExecutor`. Concurrent `aquery` calls (and `query`
    calls from several threads) share engine schedulers: their calls of one model are
    ordered together by the scheduling policy, and batch where a joint call is proven.
    """

    def __init__(
        self,
        engine: RetrieverQueryEngine,
        *,
        backend: str = DEFAULT_BACKEND,
        policy: str = "topology",
        passes: Any = True,
        profiles: Mapping[str, LatencyProfile] | None = None,
        warm_prefix: bool = True,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
        self.original = engine
        self.backend = backend
        self.policy = policy
        self._engines = EngineRegistry(warm_prefix=warm_prefix)
        self.pgraph = trace_query_engine(engine, self._engines)
        self.graph, self.passes = optimize_graph(self.pgraph, passes, self._engines.engines, profiles)
        self._runtimes = RuntimePerLoop(self._engines.engines, backend, policy)
        self._thread = LoopThread("teola:RetrieverQueryEngine")
        self._finalizer = weakref.finalize(self, self._thread.close)

    def explain(self) -> str:
        """The p-graph, the passes applied and the e-graph."""
        passes = ", ".join(self.passes) or "none"
        engines = ", ".join(self._engines.engines.engines) or "none"
        synthesizer = self.original._response_synthesizer
        how = why_opaque(synthesizer)
        return "\n".join(
            [
                "engines: " + engines,
                *warmup_notes(self._engines.engines),
                f"synthesizer {type(synthesizer).__name__}: " + (f"one call ({how})" if how else "plan + format + llm"),
                "passes: " + passes,
                "p-graph:",
                self.pgraph.summary(),
                "e-graph:",
                self.graph.summary(),
            ]
        )

    def close(self) -> None:
        """Stop the event-loop thread of `query` (it restarts if used again)."""
        self._thread.close()

    @property
    def engine_names(self) -> tuple[str, ...]:
        """The names of the engines the traced object runs on."""
        return self._runtimes.engine_names

    def runtime_for_current_loop(self) -> Any:
        """The runtime serving async calls on the running event loop (one per loop)."""
        return self._runtime()

    def _runtime(self) -> Any:
        return self._runtimes.current()

    async def _run(self, query: str | QueryBundle, sync: bool) -> Any:
        bundle = QueryBundle(query) if isinstance(query, str) else query
        try:
            out = await self._runtime().run(self.graph, {"query": bundle, "context": QueryContext(sync)})
        except PrimitiveError as exc:
            error = unwrap_error(exc, {n.id: n.module or "" for n in self.graph.nodes.values()})
        else:
            return out["response"]
        raise error

    def query(self, str_or_query_bundle: str | QueryBundle) -> Any:
        return self._thread.run(self._run(str_or_query_bundle, sync=True))

    async def aquery(self, str_or_query_bundle: str | QueryBundle) -> Any:
        return await self._run(str_or_query_bundle, sync=False)
