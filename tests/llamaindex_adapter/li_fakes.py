"""Deterministic LlamaIndex test doubles: MockLLM echoes its prompt; embeddings vary by text."""

from __future__ import annotations

import hashlib
from typing import Any

from llama_index.core import Document, VectorStoreIndex
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import MockLLM

TEXTS = [
    "Cats sleep for most of the day and hunt at dusk.",
    "Dogs were domesticated from wolves thousands of years ago.",
    "Teola schedules primitives across queries to batch engine calls.",
    "LlamaIndex pipelines connect retrievers, prompts and LLMs.",
    "Vector stores return the nearest neighbours of a query embedding.",
    "The refine mode asks the model once per retrieved chunk.",
]


class HashEmbedding(MockEmbedding):
    """A MockEmbedding whose vectors depend on the text, so retrieval ranks differ by query."""

    def _vec(self, text: str) -> list[float]:
        digest = hashlib.sha256(text.encode()).digest()
        return [b / 255.0 + 0.01 for b in digest[: self.embed_dim]]

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._vec(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._vec(text)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._vec(query)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return self._vec(text)


def make_index() -> VectorStoreIndex:
    return VectorStoreIndex.from_documents(
        [Document(text=t, id_=f"d{i}") for i, t in enumerate(TEXTS)], embed_model=HashEmbedding(embed_dim=8)
    )


def make_llm(**kwargs: Any) -> MockLLM:
    return MockLLM(**kwargs)
