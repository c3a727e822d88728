"""A Teola engine that computes what a LlamaIndex vector retriever computes, so it can replace
it (`optimize(engine, engines=[...])`) and run in a Ray actor; shipped to workers by value.

It carries the index's nodes and embed model, not the index: a pickled `VectorStoreIndex`
does not load in a fresh process without network (its `SentenceSplitter` reloads its
tokenizer from the internet), so the actor builds its own index of the same nodes.
"""

from __future__ import annotations

from typing import Any

from teola_core.engines.protocol import Call, EngineLimits, PerCallEngine
from teola_core.ir.kinds import PrimitiveKind


class IndexSearch(PerCallEngine):
    """SEARCH (a whole retrieval) as `index.as_retriever(similarity_top_k=top_k).aretrieve` does."""

    name = "index-search"
    kinds = frozenset({PrimitiveKind.SEARCH})
    limits = EngineLimits(concurrency=4)

    def __init__(self, index: Any, top_k: int) -> None:
        self.nodes = list(index.docstore.docs.values())
        self.embed_model = index._embed_model
        self.top_k = top_k
        self._retriever: Any = None  # built where the engine runs

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_retriever": None}

    async def run_call(self, call: Call) -> dict[str, Any]:
        if self._retriever is None:
            from llama_index.core import VectorStoreIndex

            index = VectorStoreIndex(self.nodes, embed_model=self.embed_model)
            self._retriever = index.as_retriever(similarity_top_k=self.top_k)
        return {"nodes": await self._retriever.aretrieve(call.inputs["query"])}
