"""What a user could change about a step Teola runs as one call (asked by the tracer, which
knows the object): `StepInfo` and `opaque_advice`. explain()'s report on a whole plan is
`plan_report`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import VectorStoreRetriever

from teola_langchain.components.classes import qualified_name
from teola_langchain.components.compression import COMPRESSION_RETRIEVER


@dataclass(frozen=True)
class StepInfo:
    """A step whose run time the plan uses: what it is and, if Teola runs it as one call, why."""

    kind: str  # "leaf", "model", "retriever", "map"
    what: str  # its class
    opaque: str | None = None  # why Teola runs it as one call (None: it does not, or it is a plain leaf)
    advice: str | None = None
    runs_as: str | None = None  # the primitives a composite component runs as (e.g. EMBED + SEARCH + RERANK)


def opaque_advice(step: Any, reason: str) -> str:
    """What the user could change so Teola sees inside `step` (it runs as one call because of `reason`)."""
    if qualified_name(step) == COMPRESSION_RETRIEVER:
        return (
            "Teola times it and plans around it; with a CrossEncoderReranker as its base_compressor over a "
            "VectorStoreRetriever Teola decomposes, it would run as EMBED + SEARCH + RERANK, its embeddings and "
            "searches batched across queries"
        )
    if isinstance(step, VectorStoreRetriever):
        return (
            "Teola times it and plans around it; with search_type='similarity' over a store Teola has proven "
            "(InMemoryVectorStore, PGVector) its embedding and search would be Teola steps, batched across queries"
        )
    if isinstance(step, BaseRetriever):
        return (
            "Teola times it (its latency is learned) and plans around it: a prompt's ready start is warmed while "
            "it runs; as a VectorStoreRetriever over a vector store Teola knows, its embeddings would also batch "
            "across queries"
        )
    if "own batch" in reason:
        return "Teola runs the map as the body's own batch(); a body with LangChain's per-item batch would be scheduled"
    return (
        "Teola times it and plans around it; if it calls models or retrievers inside, composing them as "
        "LangChain runnables in the chain (LangChain's own classes, methods not replaced) lets Teola schedule them"
    )
