"""`QueryFusionRetriever` (LlamaIndex's multi-query retrieval) as primitives.

    nodes = trace_fusion_records(b, engines, fusion_retriever, query, ctx)  # the default
    nodes = trace_fusion(b, engines, fusion_retriever, query, ctx)          # decompose=True

By default the query-generation call is a PREFILL + DECODE on the LLM's engine, inside
the fusion retriever's own records (`retrieval_spans`), made exactly as `_retrieve` /
`_aretrieve` makes it (`complete(prompt)`, or `acomplete` where the async path awaits it;
0.12's async path calls the sync `complete`, which Teola runs off the event loop); then
one step retrieves every query with the sub-retrievers' own methods as the library does,
fuses with the retriever's own method and closes the records: the same records as plain.

With `decompose=True` the DECODE's items (`FusionQueries`, the retriever's own parse of
its lines, incrementally) go to their EMBED + SEARCH as soon as each line is written; the
original query's retrievals start at once; one step fuses (the records then differ). The
rules, and when it cannot stream (`why_not_traced`): docs/llamaindex.md ("QueryFusionRetriever").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from llama_index.core.retrievers.fusion_retriever import FUSION_MODES, QueryFusionRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle

from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.kinds import PortSpec, PrimitiveKind, spec_of
from teola_core.ir.split_units import ItemParser, Lines, SplitUnit
from teola_core.ir.types import PortType
from teola_llamaindex.engines import needs_embedding
from teola_llamaindex.registry import EngineRegistry
from teola_llamaindex.retrieval_spans import RetrievalSpans
from teola_llamaindex.scope import QueryContext
from teola_llamaindex.synthesis import max_tokens_hint
from teola_llamaindex.vector_retrieval import (
    as_bundles,
    decomposable,
    finish_retrieval,
    only,
    open_retrieval,
    resolve_objects,
    trace_vector_retrieval,
)


def query_lines(text: str) -> list[str]:
    """`_get_queries`' parse of the model's text, before the cap: lines, stripped, non-empty."""
    return Lines().parse(text.strip("`"))


class FusionQueries(SplitUnit):
    """The generated queries, parsed as `QueryFusionRetriever._get_queries` does, as bundles."""

    name = "fusion-queries"

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def parse(self, text: str) -> list[QueryBundle]:
        return [QueryBundle(q) for q in query_lines(text)[: self.limit]]

    def parser(self) -> ItemParser:
        return _FusionQueriesParser(self.limit)

    def __repr__(self) -> str:
        return f"FusionQueries(limit={self.limit})"


class _FusionQueriesParser(ItemParser):
    """Complete lines are final, except that the text's ends lose their backticks.

    `text.strip("`")` touches only the first line's start and the last line's end, so
    a complete first line loses its leading backticks here and the rest at `close`
    loses its trailing ones; every other line is the library's line as is.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._pending = ""
        self._first = True
        self._emitted = 0

    def feed(self, delta: str) -> list[Any]:
        self._pending += delta
        *complete, self._pending = self._pending.split("\n")
        return self._take(complete)

    def close(self) -> list[Any]:
        rest, self._pending = self._pending.rstrip("`"), ""
        return self._take([rest])

    def _take(self, lines: list[str]) -> list[QueryBundle]:
        out = []
        for line in lines:
            if self._first:
                line, self._first = line.lstrip("`"), False
            query = line.strip()
            if query and self._emitted < self._limit:
                out.append(QueryBundle(query))
                self._emitted += 1
        return out


def why_not_traced(retriever: QueryFusionRetriever) -> str | None:
    """Why `decompose=True` cannot stream this fusion retriever (it then takes the default
    path, `trace_fusion_records`), or None."""
    if not all(decomposable(r) for r in retriever._retrievers):
        return "a sub-retriever is not a VectorIndexRetriever"
    if retriever._verbose and any(r._verbose for r in retriever._retrievers):
        return "verbose, with a verbose sub-retriever (their prints would interleave differently)"
    if not retriever.use_async and len(retriever._retrievers) > 1:
        return "use_async=False with several retrievers (they share one bundle's embedding)"
    return None


def trace_fusion_records(
    b: GraphBuilder, engines: EngineRegistry, fusion: QueryFusionRetriever, query: Value, ctx: Value
) -> Value:
    """The primitives of `fusion.(a)retrieve(query)` with its records as plain's (the module
    docstring); returns the nodes' Value."""
    outputs = ("bundles", "inner", "spans")
    opened = b.call(open_retrieval(fusion), {"query": query, "ctx": ctx}, outputs=outputs, name="open")
    bundle = b.call(only, {"batch": opened}, name="bundle", inline=True)
    inner = b.call_outputs(opened, "inner")
    inputs: dict[str, Value] = {"spans": b.call_outputs(opened, "spans"), "query": bundle}
    generated = fusion.num_queries - 1
    if generated > 0:
        prompt = b.call(_prompt(fusion.query_gen_prompt, generated), {"query": bundle}, name="prompt", inline=True)
        engine = engines.llm(fusion._llm)
        prefill = b.add(PrimitiveKind.PREFILL, {"prompt": prompt}, engine=engine, name="generate_queries.prefill")
        spec = spec_of(PrimitiveKind.DECODE)
        assert spec.inputs is not None
        config = {"max_tokens": max_tokens_hint(fusion._llm), "api": "complete_text", "sync_api": _sync_api()}
        decode = b.add(
            PrimitiveKind.DECODE,
            {"kv": Value(prefill.id, "kv"), "ctx": inner},
            engine=engine,
            config=config,
            input_ports=(*spec.inputs, PortSpec("ctx", PortType.ANY)),
            output_ports=(PortSpec("text", PortType.TEXT),),
            name="generate_queries.decode",
        )
        inputs["text"] = Value(decode.id, "text")
    return b.call(_retrieve_and_fuse(fusion), {**inputs, "inner": inner}, name="fuse")


def _sync_api() -> bool:
    """True where the async path calls the sync `complete` (before `_aget_queries`, 0.13)."""
    return "_aget_queries" not in vars(QueryFusionRetriever)


def _retrieve_and_fuse(fusion: QueryFusionRetriever) -> Callable[..., Any]:
    """The rest of `_retrieve` / `_aretrieve` once the model has answered, then `retrieve`'s end."""
    generated = fusion.num_queries - 1

    async def run(
        spans: RetrievalSpans, query: QueryBundle, inner: QueryContext, text: str | None = None
    ) -> list[NodeWithScore]:
        queries = [query]
        if text is not None:
            lines = query_lines(text)
            if fusion._verbose:
                queries_str = "\n".join(lines)
                print(f"Generated queries:\n{queries_str}")
            queries.extend(QueryBundle(q) for q in lines[:generated])
        results = await _run_queries(fusion, queries, inner)
        return await finish_retrieval(spans, _fused(fusion, results))

    return run


async def _run_queries(
    fusion: QueryFusionRetriever, queries: list[QueryBundle], inner: QueryContext
) -> dict[tuple[str, int], list[NodeWithScore]]:
    """Every query on every sub-retriever with the library's own method for the path: in a sync
    call on the caller's thread (nested `aretrieve`s with `use_async`, else `retrieve`s one
    after another), in an async call `aretrieve`s gathered."""
    if inner.sync:
        run = fusion._run_nested_async_queries if fusion.use_async else fusion._run_sync_queries
        return await inner.blocking(run, queries)
    return await inner.awaiting(fusion._run_async_queries(queries))


def trace_fusion(
    b: GraphBuilder, engines: EngineRegistry, fusion: QueryFusionRetriever, query: Value, ctx: Value
) -> Value:
    """The primitives of `fusion.(a)retrieve(query)`, the generated queries streamed into their
    retrievals (`decompose=True`; records differ); returns the nodes' Value."""
    bundle = b.call(_as_bundle, {"query": query}, name="bundle", inline=True)
    # The sub-retrievals go through aretrieve when use_async is set, even in a sync call.
    sub_ctx = b.call(_sub_context(fusion.use_async), {"ctx": ctx}, name="sub_context", inline=True)
    hits: dict[str, Value] = {
        f"original_{i}": trace_vector_retrieval(b, engines, r, bundle, sub_ctx, spans=False)
        for i, r in enumerate(fusion._retrievers)
    }
    inputs: dict[str, Value] = {"query": bundle, "ctx": ctx}
    embedded: dict[str, Value] = {}
    generated = fusion.num_queries - 1
    if generated > 0:
        prompt = b.call(_prompt(fusion.query_gen_prompt, generated), {"query": bundle}, name="prompt", inline=True)
        out = b.llm(
            prompt,
            engine=engines.llm(fusion._llm),
            max_tokens=max_tokens_hint(fusion._llm),
            split_unit=FusionQueries(generated),
            expected_items=generated,
            name="generate_queries",
            api="predict",
            formatted=False,
        )
        assert out.items is not None
        inputs["queries"] = out.items
        if fusion._verbose:
            inputs["text"] = out.text
        for i, r in enumerate(fusion._retrievers):
            vectors = b.embed(
                out.items,
                engine=engines.embedding(r._embed_model),
                items=generated,
                needs_embedding=needs_embedding(r),
                embedded_queries=True,
            )
            # SEARCH needs an index input; with embedded queries the engine reads only the
            # vectors (each one a query with its embedding), so this is the retriever itself.
            index = b.call(_constant(r), {}, name="retriever", inline=True)
            hits[f"generated_{i}"] = b.search(
                vectors,
                index,
                engine=engines.vector_search(r),
                top_k=r.similarity_top_k,
                items=generated,
                embedded_queries=True,
            )
            embedded[f"embedded_{i}"] = vectors
    return b.call(_fuse(fusion), {**inputs, "sub_ctx": sub_ctx, **hits, **embedded}, name="fuse")


def _as_bundle(query: Any) -> QueryBundle:
    """`retrieve(str)` wraps a string as `BaseRetriever.retrieve` does."""
    return only(as_bundles(query))


def _sub_context(use_async: bool) -> Callable[[QueryContext], QueryContext]:
    def sub(ctx: QueryContext) -> QueryContext:
        return dataclasses.replace(ctx, sync=ctx.sync and not use_async)

    return sub


def _prompt(template: str, generated: int) -> Callable[[QueryBundle], str]:
    def prompt(query: QueryBundle) -> str:
        return template.format(num_queries=generated, query=query.query_str)

    return prompt


def _constant(value: Any) -> Callable[[], Any]:
    def constant() -> Any:
        return value

    return constant


def _fuse(fusion: QueryFusionRetriever) -> Callable[..., Any]:
    n = len(fusion._retrievers)

    resolvers = [resolve_objects(r) for r in fusion._retrievers]
    resolve_own = resolve_objects(fusion)

    async def fuse(
        query: QueryBundle,
        ctx: QueryContext,
        sub_ctx: QueryContext,
        queries: list[QueryBundle] | None = None,
        text: str | None = None,
        **hits: Any,
    ) -> list[NodeWithScore]:
        if text is not None:  # `_get_queries`' print: every line the model wrote, before the cap
            queries_str = "\n".join(query_lines(text))
            print(f"Generated queries:\n{queries_str}")
        results: dict[tuple[str, int], list[NodeWithScore]] = {}
        for i in range(n):
            results[(query.query_str, i)] = hits[f"original_{i}"]
        for j, q in enumerate(queries or ()):
            for i in range(n):
                # The sync sub-retrieval stored the embedding on the bundle it resolves with.
                bundle = hits[f"embedded_{i}"][j] if sub_ctx.sync else q
                results[(q.query_str, i)] = await resolvers[i](bundle, hits[f"generated_{i}"][j], sub_ctx)
        return await resolve_own(query, _fused(fusion, results), ctx)

    return fuse


def _fused(fusion: QueryFusionRetriever, results: dict[tuple[str, int], list[NodeWithScore]]) -> list[NodeWithScore]:
    """The end of `QueryFusionRetriever._retrieve`: fuse by mode, keep the top k."""
    top_k = fusion.similarity_top_k
    if fusion.mode == FUSION_MODES.RECIPROCAL_RANK:
        return fusion._reciprocal_rerank_fusion(results)[:top_k]
    if fusion.mode == FUSION_MODES.RELATIVE_SCORE:
        return fusion._relative_score_fusion(results)[:top_k]
    if fusion.mode == FUSION_MODES.DIST_BASED_SCORE:
        return fusion._relative_score_fusion(results, dist_based=True)[:top_k]
    if fusion.mode == FUSION_MODES.SIMPLE:
        return fusion._simple_fusion(results)[:top_k]
    raise ValueError(f"Invalid fusion mode: {fusion.mode}")
