"""A `VectorIndexRetriever` split into EMBED + SEARCH primitives (the default).

    nodes = trace_vector_retrieval(b, engines, retriever, query, ctx)

A first step opens what `retrieve` / `aretrieve` records before the embedding (its span,
`RetrievalStartEvent`, the RETRIEVE callback event, `_retrieve`'s span: `retrieval_spans`);
EMBED computes the query embedding as `_retrieve` / `_aretrieve` would and SEARCH runs the
retriever's search half, both in that span and through the API the query uses (sync or
async); a last step resolves `IndexNode`s with the bundle the library would pass and
closes the rest. The same nodes and the same records as plain, with the embeddings of
concurrent queries on one engine. Details: docs/llamaindex.md ("Decomposed components").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.indices.vector_store.retrievers.retriever import VectorIndexRetriever
from llama_index.core.schema import IndexNode, NodeWithScore, QueryBundle

from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.kinds import PortSpec, PrimitiveKind, spec_of
from teola_core.ir.types import PortType
from teola_llamaindex.engines import needs_embedding
from teola_llamaindex.registry import EngineRegistry
from teola_llamaindex.retrieval_spans import RetrievalSpans
from teola_llamaindex.scope import QueryContext


def decomposable(retriever: Any) -> bool:
    """True when `retriever` is exactly a `VectorIndexRetriever` (a subclass may override `_retrieve`)."""
    return type(retriever) is VectorIndexRetriever


def as_bundles(query: Any) -> list[QueryBundle]:
    """The one-bundle batch EMBED takes: `retrieve(str)` wraps a string as LlamaIndex does."""
    return [QueryBundle(query) if isinstance(query, str) else query]


def trace_vector_retrieval(
    b: GraphBuilder, engines: EngineRegistry, retriever: Any, query: Value, ctx: Value, *, spans: bool = True
) -> Value:
    """EMBED + SEARCH for `retriever.(a)retrieve(query)`; returns the nodes' Value.

    `spans=False`: without the retriever's own records (inside a decomposed
    `QueryFusionRetriever`, whose records differ anyway).
    """
    opened: Value | None = None
    inner: Value | None = None  # the context EMBED and SEARCH call the framework in
    if spans:
        outputs = ("bundles", "inner", "spans")
        opened = b.call(open_retrieval(retriever), {"query": query, "ctx": ctx}, outputs=outputs, name="open")
        bundles, inner = opened, b.call_outputs(opened, "inner")
    else:
        bundles = b.call(as_bundles, {"query": query}, name="bundle", inline=True)
    embed = engines.embedding(retriever._embed_model)
    vectors = _one_query(
        b, PrimitiveKind.EMBED, {"texts": bundles}, inner, embed, needs_embedding=needs_embedding(retriever)
    )
    attached = b.call(
        attach_embedding, {"bundles": bundles, "vectors": vectors, "ctx": ctx}, name="attach", inline=True
    )
    search = engines.vector_search(retriever)
    inputs = {"vectors": vectors, "index": attached}
    hits = _one_query(b, PrimitiveKind.SEARCH, inputs, inner, search, top_k=retriever.similarity_top_k)
    nodes = b.call(only, {"batch": hits}, name="nodes", inline=True)
    if opened is not None:
        return b.call(finish_retrieval, {"spans": b.call_outputs(opened, "spans"), "nodes": nodes}, name="resolve")
    bundle = b.call(only, {"batch": attached}, name="bundle_after", inline=True)
    return b.call(resolve_objects(retriever), {"bundle": bundle, "nodes": nodes, "ctx": ctx}, name="resolve")


def _one_query(
    b: GraphBuilder, kind: PrimitiveKind, inputs: dict[str, Value], ctx: Value | None, engine: str, **config: Any
) -> Value:
    """A one-query EMBED or SEARCH; with `ctx`, its framework calls run in that context."""
    spec = spec_of(kind)
    assert spec.inputs is not None and spec.outputs is not None
    ports = spec.inputs
    if ctx is not None:
        inputs = {**inputs, "ctx": ctx}
        ports = (*ports, PortSpec("ctx", PortType.ANY))
    node = b.add(kind, inputs, engine=engine, config=config, items=1, input_ports=ports)
    return Value(node.id, spec.outputs[0].name)


def open_retrieval(retriever: BaseRetriever) -> Callable[..., Any]:
    """The step that opens `retrieve`'s records (`RetrievalSpans.open`; a sync query's on its thread)."""

    async def open_(query: Any, ctx: QueryContext) -> dict[str, Any]:
        spans = RetrievalSpans(retriever, query, ctx)
        bundle, inner = await ctx.blocking(spans.open) if ctx.sync else spans.open()
        return {"bundles": [bundle], "inner": inner, "spans": spans}

    return open_


async def finish_retrieval(spans: RetrievalSpans, nodes: list[NodeWithScore]) -> list[NodeWithScore]:
    """The search is done: `_retrieve` exits, objects resolve, `retrieve`'s records close."""
    if spans.ctx.sync:
        return await spans.calls.blocking(spans.finish, nodes)
    return await spans.afinish(nodes)


def attach_embedding(bundles: list[QueryBundle], vectors: list[Any], ctx: QueryContext) -> list[QueryBundle]:
    """Sync queries: store the embedding on the bundle, as the sync `_retrieve` does."""
    if ctx.sync:
        for bundle, vector in zip(bundles, vectors, strict=True):
            if bundle.embedding is None and vector is not None:
                bundle.embedding = vector
    return bundles


def only(batch: list[Any]) -> Any:
    """The single element of a one-element batch (SEARCH's nodes, EMBED's bundle)."""
    (element,) = batch
    return element


def resolve_objects(retriever: BaseRetriever) -> Callable[..., Any]:
    """`BaseRetriever.(a)retrieve`'s end without its records: resolve `IndexNode`s, drop duplicates.

    With the bundle the library passes: the sync `_retrieve` has stored the embedding on
    it (`attach_embedding` did the same), the async one has not. A sync query resolves
    objects on the caller's thread (they may retrieve), and inline when there is nothing
    to resolve (the step only drops duplicates then).
    """

    async def resolve(bundle: QueryBundle, nodes: list[NodeWithScore], ctx: QueryContext) -> list[NodeWithScore]:
        if ctx.sync and not any(isinstance(n.node, IndexNode) for n in nodes):
            return retriever._handle_recursive_retrieval(bundle, nodes)
        return await ctx.call(
            retriever._handle_recursive_retrieval, retriever._ahandle_recursive_retrieval, bundle, nodes
        )

    return resolve
