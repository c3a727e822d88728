"""Latency profiles modelled on the paper's setting, and the benchmark's engine set.

The paper (Tan et al. 2024, and the Ayo README) runs a 7B LLM with vLLM on RTX 3090s
(24 GB), bge-class embedding and reranking models, and Postgres with pgvector. The
numbers below are chosen so that the simulated engines have the *shapes* that Teola's
passes and schedulers exploit, anchored on the figures the paper states.

Embedder (bge-large class, items = chunks of ~100 tokens), seconds per batch:
    1: 0.10   2: 0.12   4: 0.15   8: 0.27   16: 0.45   32: 0.88   64: 1.76
  Anchored on the paper's one measured engine fact: 48 chunks take 1.8 s at batch 4
  (12 x 0.15) and 1.35 s at batch 16 (3 x 0.45). Throughput (items/s) is 10, 17, 27,
  30, 36, 36, 36: it stops growing at 16, the max efficient batch (10 % tolerance).
  These are slower than a bare bge-large forward pass on a 3090 because the paper's
  figure includes tokenisation and serving overhead; we keep the paper's figure.

Vector DB (pgvector class: one Postgres, HNSW cosine index):
    ingest (rows)    1: 0.010   16: 0.030   64: 0.100   256: 0.400
    search (queries) 1: 0.010    4: 0.016   16: 0.040   64: 0.160
  A round trip costs ~10 ms (client, planner, commit); an inserted row ~1.5 ms with
  index maintenance; an HNSW top-k query ~2 ms. Max efficient batch: 64 for ingest,
  16 for search.

Reranker (bge-reranker-large class cross-encoder, items = (query, passage) pairs):
    1: 0.10   4: 0.16   8: 0.26   16: 0.46   32: 0.90   64: 1.78
  The same model size as the embedder over slightly longer inputs (query + passage),
  so a little slower per item; max efficient batch 16.

LLM (7B, fp16, vLLM on one 24 GB RTX 3090):
    prefill (tokens in a step)  16: 0.020  64: 0.030  128: 0.045  256: 0.075  512: 0.140
                                1024: 0.270  2048: 0.540  4096: 1.080  8192: 2.200
    decode (sequences in a step)  1: 0.025  4: 0.026  8: 0.027  16: 0.029  32: 0.033
                                  64: 0.042  128: 0.060
  A 7B forward pass is ~14 GFLOP per token; at the ~55 TFLOPS a 3090 sustains in fp16,
  prefill reaches ~3,800 tokens/s on long inputs, with a ~15 ms floor per step. A decode
  step is memory-bound: reading ~14 GB of weights at ~900 GB/s takes ~16 ms, ~25 ms
  with vLLM's overheads, and grows slowly with the batch (KV reads), so decode
  throughput keeps growing with the batch. The KV cache left beside the weights
  (~8 GB at 0.5 MB per token) holds about 16k tokens: the prefix cache's capacity.

With these, one naive-RAG query (48 chunks, top-4, 48-token answer) takes about 3 s
run module by module, of the order of the Ayo README's 3.72 s.

    engines = paper_engines(time_scale=0.1, prefix_cache=True, responder=FakeModel())
    engines["llm"].stats.cache_hit_tokens
"""

from __future__ import annotations

from teola_adapters.simulated.embedding import SimEmbedder
from teola_adapters.simulated.llm import Responder, SimLLM
from teola_adapters.simulated.reranker import SimReranker
from teola_adapters.simulated.vectordb import SimVectorDB
from teola_core.engines.protocol import EngineSet
from teola_core.profiles.profile import Curve, LatencyProfile

EMBEDDER = LatencyProfile(
    "embedder",
    {"embed": Curve(((1, 0.10), (2, 0.12), (4, 0.15), (8, 0.27), (16, 0.45), (32, 0.88), (64, 1.76)))},
)
VECTORDB = LatencyProfile(
    "vectordb",
    {
        "ingest": Curve(((1, 0.010), (16, 0.030), (64, 0.100), (256, 0.400))),
        "search": Curve(((1, 0.010), (4, 0.016), (16, 0.040), (64, 0.160))),
    },
)
RERANKER = LatencyProfile(
    "reranker",
    {"rerank": Curve(((1, 0.10), (4, 0.16), (8, 0.26), (16, 0.46), (32, 0.90), (64, 1.78)))},
)
LLM = LatencyProfile(
    "llm",
    {
        "prefill": Curve(
            (
                (16, 0.020),
                (64, 0.030),
                (128, 0.045),
                (256, 0.075),
                (512, 0.140),
                (1024, 0.270),
                (2048, 0.540),
                (4096, 1.080),
                (8192, 2.200),
            )
        ),
        "decode": Curve(((1, 0.025), (4, 0.026), (8, 0.027), (16, 0.029), (32, 0.033), (64, 0.042), (128, 0.060))),
    },
)
LLM_CACHE_TOKENS = 16_384
LLM_INSTANCES = 2  # the paper's evaluation: two instances per LLM, one per other engine


def paper_profiles() -> dict[str, LatencyProfile]:
    """The four profiles by engine name (unscaled seconds)."""
    return {p.engine: p for p in (EMBEDDER, VECTORDB, RERANKER, LLM)}


def paper_engines(time_scale: float = 1.0, prefix_cache: bool = True, responder: Responder | None = None) -> EngineSet:
    """Fresh simulated engines named "embedder", "vectordb", "reranker" and "llm".

    One instance of each non-LLM engine and two of the LLM, as in the paper's
    evaluation (the LLM's continuous batching lets up to 64 calls share it; the
    per-invocation baselines run one invocation per LLM instance at a time). Engines carry the unscaled
    profiles: `time_scale` is how the simulation spends time, not a property of the
    engines the profiles describe. `prefix_cache=False` is the LlamaDist baseline.
    """
    return (
        EngineSet()
        .add(SimEmbedder(EMBEDDER, time_scale=time_scale))
        .add(SimVectorDB(VECTORDB, time_scale=time_scale))
        .add(SimReranker(RERANKER, time_scale=time_scale))
        .add(
            SimLLM(
                LLM,
                time_scale=time_scale,
                responder=responder,
                prefix_cache=prefix_cache,
                cache_tokens=LLM_CACHE_TOKENS,
                instances=LLM_INSTANCES,
            )
        )
    )
