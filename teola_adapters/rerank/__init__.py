"""Rerankers: MiniLM cosine re-scoring by default, a cross-encoder when a model path is given.

reranker = make_reranker()                       # EmbeddingReranker, MiniLM ("teola[local]")
reranker = make_reranker(embedder=embedder)      # shares the embedding engine's model
reranker = make_reranker("/models/my-cross-encoder")   # CrossEncoderReranker
"""

from teola_adapters.rerank.engine import (
    BatchedReranker,
    CrossEncoderReranker,
    EmbeddingReranker,
    make_reranker,
    measure_profile,
)

__all__ = ["BatchedReranker", "CrossEncoderReranker", "EmbeddingReranker", "make_reranker", "measure_profile"]
