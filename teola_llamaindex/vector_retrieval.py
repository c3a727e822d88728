"""A `VectorIndexRetriever` split into EMBED + SEARCH primitives (`decompose=True`).

    nodes = trace_vector_retrieval(b, engines, retriever, query, ctx)

EMBED computes the query embedding as `aretrieve` would, SEARCH runs the retriever's
`_aretrieve` with that embedding set, and a last step resolves `IndexNode`s with the
bundle the library would pass (`resolve_objects`): the same nodes, with the embeddings
of concurrent queries on one engine. The retriever's own spans and retrieval events are
not emitted on this path. Details: docs/llamaindex.md ("Decomposed components").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.indices.vector_store.retrievers.retriever import VectorIndexRetriever
from llama_index.core.schema import IndexNode, NodeWithScore, QueryBundle

from teola_core.ir.builder import GraphBuilder, Value
from teola_llamaindex.engines import needs_embedding
from teola_llamaindex.registry import EngineRegistry
from teola_llamaindex.scope import QueryContext


def decomposable(retriever: Any) -> bool:
    """True when `retriever` is exactly a `VectorIndexRetriever` (see the module docstring)."""
    return type(retriever) is VectorIndexRetriever


def as_bundles(query: Any) -> list[QueryBundle]:
    """The one-bundle batch EMBED takes: `retrieve(str)` wraps a string as LlamaIndex does."""
    return [QueryBundle(query) if isinstance(query, str) else query]


def trace_vector_retrieval(b: GraphBuilder, engines: EngineRegistry, retriever: Any, query: Value, ctx: Value) -> Value:
    """EMBED + SEARCH for `retriever.(a)retrieve(query)`; returns the nodes' Value."""
    bundles = b.call(as_bundles, {"query": query}, name="bundle", inline=True)
    vectors = b.embed(
        bundles,
        engine=engines.embedding(retriever._embed_model),
        items=1,
        needs_embedding=needs_embedding(retriever),
    )
    attached = b.call(
        attach_embedding, {"bundles": bundles, "vectors": vectors, "ctx": ctx}, name="attach", inline=True
    )
    hits = b.search(
        vectors, attached, engine=engines.vector_search(retriever), top_k=retriever.similarity_top_k, items=1
    )
    nodes = b.call(only, {"batch": hits}, name="nodes", inline=True)
    bundle = b.call(only, {"batch": attached}, name="bundle_after", inline=True)
    return b.call(resolve_objects(retriever), {"bundle": bundle, "nodes": nodes, "ctx": ctx}, name="resolve")


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
    """`BaseRetriever.(a)retrieve`'s end: resolve `IndexNode`s, drop duplicates.

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
