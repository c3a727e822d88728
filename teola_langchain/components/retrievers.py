"""When a retriever may run as EMBED + SEARCH primitives, and when embeddings may batch.

`VectorStoreRetriever.invoke(q)` with `search_type="similarity"` calls
`vectorstore.similarity_search(q, **search_kwargs)`. Teola splits that into
`embeddings.embed_query(q)` (EMBED) and `vectorstore.similarity_search_by_vector(v,
**search_kwargs)` (SEARCH) only for store classes whose source shows that is the same
computation. The proof is per class, recorded in `_PROVEN_STORES` with the methods it
relies on; the store must be exactly that class (a subclass may override them) and
must not have overridden them on the instance. Anything else — another search type,
a search kwarg the proof does not cover, an unknown store, a retriever subclass — is
one opaque call of the retriever (with a warning that names the reason).

Stores of other packages are proven by their qualified class name and the versions of
the package whose source was read (`_PROVEN_STORES_BY_NAME`), so Teola imports none of
them: other versions keep their retrievers opaque until their source is read. A proof
may say the store's sync and async searches are different code (`follows_mode`): its
SEARCH then runs the sync method for queries made through sync methods, as LangChain does.

Embedding batching across queries: EMBED calls from several queries may be sent as one
`embed_documents` only for embedding classes whose `embed_query(x)` is by construction
`embed_documents([x])[0]` (`_BATCHABLE_EMBEDDINGS`, exact class). For every other class
the engine calls `aembed_query` once per text, concurrently: many providers embed
queries and documents differently (instructions, input types), so batching them would
change results.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore, VectorStoreRetriever

from teola_langchain.components.classes import class_of, installed_within, qualified_name


@dataclass(frozen=True)
class StoreProof:
    """Why a store's `similarity_search(q, **kw)` is `similarity_search_by_vector(embed_query(q), **kw)`.

    kwargs: the search kwargs the proof covers. methods: the methods it reads (an
    instance that overrides one is not covered). follows_mode: the sync and async
    searches are different code, so a query searches the way its caller called.
    """

    kwargs: frozenset[str]
    methods: tuple[str, ...]
    follows_mode: bool = False


# InMemoryVectorStore (langchain-core 1.8, vectorstores/in_memory.py):
#   similarity_search(q, k, **kw) -> similarity_search_with_score(q, k, **kw)
#     -> similarity_search_with_score_by_vector(embed_query(q), k, **kw)
#   similarity_search_by_vector(v, k, **kw) -> similarity_search_with_score_by_vector(v, k, **kw)
#   asimilarity_search(...) -> aembed_query(q), then the same sync search;
#   asimilarity_search_by_vector(v, k, **kw) -> similarity_search_by_vector(v, k, **kw).
#   The default k is 4 on both paths; `filter` is the only search kwarg it reads.
_PROVEN_STORES: dict[type[VectorStore], StoreProof] = {
    InMemoryVectorStore: StoreProof(
        frozenset({"k", "filter"}),
        (
            "similarity_search",
            "asimilarity_search",
            "similarity_search_with_score",
            "asimilarity_search_with_score",
            "similarity_search_by_vector",
            "asimilarity_search_by_vector",
            "similarity_search_with_score_by_vector",
        ),
    ),
}

# PGVector (langchain-postgres 0.0.19, langchain_postgres/vectorstores.py):
#   similarity_search(q, k=4, filter=None, **ignored) -> embed_query(q)
#     -> similarity_search_by_vector(v, k, filter) -> similarity_search_with_score_by_vector
#     -> one query on the store's sync engine (asserts the store is not in async mode);
#   asimilarity_search(q, k=4, filter=None, **ignored) -> lazy async init, aembed_query(q)
#     -> asimilarity_search_by_vector(v, k, filter) -> asimilarity_search_with_score_by_vector
#     -> the same query on its async engine (asserts async mode; lazy init again, idempotent).
#   Documents are built from the rows alike on both paths; `k` and `filter` are the only
#   search kwargs read. The sync and async paths use different engines: follows_mode.
_PROVEN_STORES_BY_NAME: dict[str, tuple[str, tuple[str, str], StoreProof]] = {
    "langchain_postgres.vectorstores.PGVector": (
        "langchain-postgres",
        ("0.0.19", "0.1"),  # versions read, as [first, before)
        StoreProof(
            frozenset({"k", "filter"}),
            (
                "similarity_search",
                "asimilarity_search",
                "similarity_search_by_vector",
                "asimilarity_search_by_vector",
                "similarity_search_with_score_by_vector",
                "asimilarity_search_with_score_by_vector",
            ),
            follows_mode=True,
        ),
    ),
}

# DeterministicFakeEmbedding: embed_query(t) and each embed_documents item are
# `_get_embedding(seed=_get_seed(t))`, a pure function of the text.
_BATCHABLE_EMBEDDINGS: frozenset[type[Embeddings]] = frozenset({DeterministicFakeEmbedding})


@dataclass(frozen=True)
class Decomposition:
    """How to run one retriever as primitives."""

    store: VectorStore
    embeddings: Embeddings
    search_kwargs: dict[str, Any]
    top_k: int


def decompose(retriever: BaseRetriever) -> Decomposition | str:
    """The EMBED + SEARCH plan for `retriever`, or the reason it must stay opaque."""
    if class_of(retriever) is not VectorStoreRetriever:
        return f"{type(retriever).__name__} is not a plain VectorStoreRetriever"
    if retriever.search_type != "similarity":
        return f"search_type {retriever.search_type!r} (only 'similarity' is decomposed)"
    store = retriever.vectorstore
    proof = store_proof(store)
    if isinstance(proof, str):
        return proof
    extra = set(retriever.search_kwargs) - proof.kwargs
    if extra:
        return f"search kwargs {sorted(extra)} are not covered by the proof for {type(store).__name__}"
    if any(name in vars(store) for name in proof.methods):
        return f"the {type(store).__name__} instance overrides a search method"
    embeddings = store.embeddings
    if embeddings is None:
        return f"{type(store).__name__} has no embeddings"
    k = retriever.search_kwargs.get("k")
    if k is None:
        k = inspect.signature(type(store).similarity_search_by_vector).parameters["k"].default
    return Decomposition(store, embeddings, dict(retriever.search_kwargs), int(k))


def store_proof(store: VectorStore) -> StoreProof | str:
    """The proof for the store's exact class, or why there is none."""
    cls = class_of(store)
    proof = _PROVEN_STORES.get(cls)
    if proof is not None:
        return proof
    known = _PROVEN_STORES_BY_NAME.get(qualified_name(store))
    if known is None:
        return f"no equivalence proof for vector store {cls.__name__}"
    distribution, (first, before), proof = known
    covered, version = installed_within(distribution, first, before)
    if not covered:
        return f"the proof for {cls.__name__} covers {distribution} >= {first}, < {before}, not {version}"
    return proof


def follows_mode(store: VectorStore) -> bool:
    """Whether the store's sync and async searches are different code (see `StoreProof`)."""
    proof = store_proof(store)
    return not isinstance(proof, str) and proof.follows_mode


def batchable_embeddings(embeddings: Embeddings) -> bool:
    """`embed_documents` over many queries equals `embed_query` on each (see above)."""
    return class_of(embeddings) in _BATCHABLE_EMBEDDINGS
