"""Teola engines that compute what LangChain components compute, so they can replace them
(`optimize(chain, engines=[...])`) and run in Ray actors; shipped to workers by value."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits
from teola_core.ir.kinds import PrimitiveKind


class FakeEmbedder(Engine):
    """EMBED as LangChain's `DeterministicFakeEmbedding(size)` embeds a query."""

    name = "fake-embedder"
    kinds = frozenset({PrimitiveKind.EMBED})
    limits = EngineLimits(concurrency=4)

    def __init__(self, size: int) -> None:
        self.size = size

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        from langchain_core.embeddings import DeterministicFakeEmbedding

        embedder = DeterministicFakeEmbedding(size=self.size)
        return [{"vectors": [embedder.embed_query(t) for t in c.inputs["texts"]]} for c in calls]


class StoreSearch(Engine):
    """SEARCH on a copy of a LangChain store, by its by-vector search (reads only)."""

    name = "store-search"
    kinds = frozenset({PrimitiveKind.SEARCH})
    limits = EngineLimits(concurrency=4)

    def __init__(self, store: Any) -> None:
        self.store = store

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        results: list[CallResult] = []
        for call in calls:
            kwargs = call.node.config.get("search_kwargs", {})
            hits = [await self.store.asimilarity_search_by_vector(v, **kwargs) for v in call.inputs["vectors"]]
            results.append({"hits": hits})
        return results
