"""What the LlamaIndex bench examples share (both llama-index-core lines): corpus, index, prompts.

The prompts follow the simulated servers' `ExampleResponder` instructions.
"""

from __future__ import annotations

from llama_index.core import VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.llms import LLM
from llama_index.core.retrievers import QueryFusionRetriever
from llama_index.core.schema import TextNode

from teola_adapters.simulated.text import make_chunks, make_question

TOP_K = 3
ANSWER = (
    "You are a careful assistant. Answer the question using only the context passages. "
    "Keep the answer short and precise.\nContext:\n{context}\n\nQuestion: {question}\nAnswer in about 32 words."
)


def corpus(n: int = 64, words_per_chunk: int = 60) -> list[str]:
    return make_chunks("kb", n, words_per_chunk)


def questions(n: int) -> list[str]:
    return [make_question(f"question-{i}") for i in range(n)]


def build_index(embed_model: BaseEmbedding) -> VectorStoreIndex:
    nodes = [TextNode(text=t, id_=f"kb{i}") for i, t in enumerate(corpus())]
    return VectorStoreIndex(nodes, embed_model=embed_model)


def fusion_retriever(llm: LLM, index: VectorStoreIndex, n_queries: int = 4) -> QueryFusionRetriever:
    """LlamaIndex's multi-query retriever: the question and `n_queries - 1` generated ones, RRF-fused."""
    return QueryFusionRetriever(
        [index.as_retriever(similarity_top_k=TOP_K)],
        llm=llm,
        num_queries=n_queries,
        similarity_top_k=TOP_K,
        mode="reciprocal_rerank",
    )
