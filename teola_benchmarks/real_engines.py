"""The paper's workloads on the real embedded engines instead of simulated ones.

SmolLM2-135M-Instruct on llama.cpp as "llm", MiniLM as "embedder", the embedded
Postgres + pgvector as "vectordb" (a fresh table per system, so every system indexes
from empty), and MiniLM cosine re-scoring as "reranker". Latencies are real, so the
time scale is 1. llama.cpp keeps its own prefix states whatever the system, so the
baselines' "no prefix cache" does not apply here. Needs `.ci/install-engines.sh`.
"""

from __future__ import annotations

from uuid import uuid4

from teola_benchmarks.workloads.common import FakeModel
from teola_core.engines.protocol import EngineSet


def real_engines(time_scale: float, prefix_cache: bool, responder: FakeModel) -> EngineSet:
    """Fresh real engines under the names the workloads use (the fake model is unused)."""
    if time_scale != 1.0:
        raise ValueError(f"real engines run in real time: the time scale must be 1, got {time_scale}")
    from teola_adapters.embeddings import SentenceTransformerEmbedder
    from teola_adapters.llamacpp import LlamaCppEngine
    from teola_adapters.pgvector import PgVectorStore
    from teola_adapters.rerank import make_reranker

    embedder = SentenceTransformerEmbedder()
    return (
        EngineSet()
        .add(embedder)
        .add(PgVectorStore(table=f"teola_bench_{uuid4().hex[:12]}", hnsw=False))
        .add(make_reranker(embedder=embedder))
        .add(LlamaCppEngine(n_threads=1))
    )
