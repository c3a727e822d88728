"""Deterministic LlamaIndex test doubles: MockLLM echoes its prompt; embeddings vary by text."""

from __future__ import annotations

import hashlib
from typing import Any

from llama_index.core import Document, VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata, MockLLM
from llama_index.core.schema import IndexNode, TextNode

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


class ReversedEmbedding(HashEmbedding):
    """Another embed model: a sub-index searched through an `IndexNode` must use its own."""

    def _vec(self, text: str) -> list[float]:
        return list(reversed(super()._vec("x" + text)))


def recursive_retriever() -> BaseRetriever:
    """A vector retriever whose index holds an `IndexNode` pointing at another index's retriever.

    The other index embeds with `ReversedEmbedding`: resolving the IndexNode with the outer
    query embedding (instead of letting the sub-retriever embed) finds different nodes.
    """
    sub_index = VectorStoreIndex.from_documents(
        [Document(text=t, id_=f"s{i}") for i, t in enumerate(TEXTS)], embed_model=ReversedEmbedding(embed_dim=8)
    )
    nodes = [TextNode(text=t, id_=f"o{i}") for i, t in enumerate(TEXTS[:3])]
    nodes.append(IndexNode(text="an index about cats at dusk", index_id="sub"))
    retriever = VectorStoreIndex(nodes, embed_model=HashEmbedding(embed_dim=8)).as_retriever(similarity_top_k=4)
    retriever.object_map["sub"] = sub_index.as_retriever(similarity_top_k=2)
    return retriever


# -- rerankers and LLMs for the rerank / synthesizer shapes ------------------------------


def pair_score(query: str, text: str) -> float:
    """A deterministic relevance of one (query, text) pair: shared words, ties broken by a hash."""
    shared = len(set(query.lower().split()) & set(text.lower().split()))
    return shared + hashlib.sha256(f"{query}|{text}".encode()).digest()[0] / 1000.0


class FakeCrossEncoder:
    """Stands in for sentence-transformers' CrossEncoder (no weights ship offline)."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def predict(self, pairs: list[tuple[str, str]]) -> Any:
        import numpy as np

        self.calls.append(len(pairs))
        return np.array([pair_score(q, t) for q, t in pairs], dtype=np.float32)


def sbert_rerank(top_n: int = 2) -> Any:
    """A real `SentenceTransformerRerank` whose model is a `FakeCrossEncoder`."""
    from llama_index.core.postprocessor import SentenceTransformerRerank

    rerank = SentenceTransformerRerank.model_construct(
        top_n=top_n, model="fake-cross-encoder", device="cpu", keep_retrieval_score=False, trust_remote_code=False
    )
    rerank._model = FakeCrossEncoder()
    return rerank


def overlap_rerank_class() -> type:
    """A user's own reranker (a `BaseNodePostprocessor`): scores by `pair_score`, keeps top_n."""
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import MetadataMode, NodeWithScore

    class OverlapRerank(BaseNodePostprocessor):
        top_n: int = 2

        def _postprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: Any = None) -> list[NodeWithScore]:
            q = query_bundle.query_str if query_bundle is not None else ""
            scored = [
                NodeWithScore(node=n.node, score=pair_score(q, n.node.get_content(metadata_mode=MetadataMode.EMBED)))
                for n in nodes
            ]
            return sorted(scored, key=lambda n: -(n.score or 0.0))[: self.top_n]

    return OverlapRerank


def make_chat_llm(**kwargs: Any) -> MockLLM:
    """A MockLLM that says it is a chat model: `achat` echoes the last message."""
    from llama_index.core.base.llms.types import ChatMessage, ChatResponse, LLMMetadata, MessageRole

    class ChatMock(MockLLM):
        @property
        def metadata(self) -> LLMMetadata:
            return LLMMetadata(num_output=self.max_tokens or -1, is_chat_model=True)

        def chat(self, messages: Any, **kw: Any) -> ChatResponse:
            text = " || ".join(f"{m.role.value}: {m.content}" for m in messages)
            return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text))

        async def achat(self, messages: Any, **kw: Any) -> ChatResponse:
            return self.chat(messages, **kw)

    return ChatMock(**kwargs)


def make_silent_llm() -> MockLLM:
    """A MockLLM whose every completion is empty (the synthesizer then says "Empty Response")."""
    from llama_index.core.base.llms.types import CompletionResponse

    class Silent(MockLLM):
        def complete(self, prompt: str, formatted: bool = False, **kw: Any) -> CompletionResponse:
            return CompletionResponse(text="")

        async def acomplete(self, prompt: str, formatted: bool = False, **kw: Any) -> CompletionResponse:
            return CompletionResponse(text="")

    return Silent()


class BrokenLLM(CustomLLM):
    """Fails every generation, as a model server that is down would."""

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(is_chat_model=False)

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        raise ConnectionError("model server down")

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise ConnectionError("model server down")
