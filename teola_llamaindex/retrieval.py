"""When a retriever runs as EMBED + SEARCH primitives, and how it is traced.

`VectorIndexRetriever.aretrieve(q)` computes the query embedding
(`embed_model.aget_agg_embedding_from_queries(q.embedding_strs)`, only when the store
needs one and `q` has none) and then searches with `QueryBundle(query_str, embedding)`.
Teola runs the first half as an EMBED primitive on the embed model's engine and the
second as a SEARCH primitive calling `aretrieve` with the embedding set, so the
retriever skips its own embedding: the same nodes, with the embeddings of concurrent
queries batched on one engine. Only the exact class `VectorIndexRetriever` is split
(a subclass may override retrieval); every other retriever is one opaque step.

The sync path of the retriever stores the computed embedding on the caller's bundle;
`attach_embedding` does the same in sync queries so a caller's bundle ends up equal.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.indices.vector_store.retrievers.retriever import VectorIndexRetriever
from llama_index.core.schema import QueryBundle

from teola_core.ir.builder import GraphBuilder, Value
from teola_llamaindex.common import QueryContext
from teola_llamaindex.engines import EngineRegistry, needs_embedding


def decomposable(retriever: Any) -> bool:
    """True when `retriever` is exactly a `VectorIndexRetriever` (see the module docstring)."""
    return type(retriever) is VectorIndexRetriever


def as_bundles(query: Any) -> list[QueryBundle]:
    """The one-bundle batch EMBED takes: `retrieve(str)` wraps a string as LlamaIndex does."""
    return [QueryBundle(query) if isinstance(query, str) else query]


def trace_retrieval(b: GraphBuilder, engines: EngineRegistry, retriever: Any, query: Value, ctx: Value) -> Value:
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
    hits = b.search(vectors, attached, engine=engines.retriever(retriever), top_k=retriever.similarity_top_k, items=1)
    return b.call(only, {"hits": hits}, name="nodes", inline=True)


def attach_embedding(bundles: list[QueryBundle], vectors: list[Any], ctx: QueryContext) -> list[QueryBundle]:
    """Sync queries: store the embedding on the bundle, as the sync `_retrieve` does."""
    if ctx.sync:
        for bundle, vector in zip(bundles, vectors, strict=True):
            if bundle.embedding is None and vector is not None:
                bundle.embedding = vector
    return bundles


def only(hits: list[Any]) -> Any:
    """The single query's nodes out of the one-element batch SEARCH returns."""
    (nodes,) = hits
    return nodes
