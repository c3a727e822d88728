"""Latency profiles modelled on the paper's setting, and the benchmark's engine set.

    engines = paper_engines(prefix_cache=True, responder=FakeModel())
    engines["llm"].stats.cache_hit_tokens      # both LLM instances added up

Where every number comes from (the paper, hardware, a measurement here, or an
assumption, each said): `docs/simulated-engines.md`.
"""

from __future__ import annotations

from collections.abc import Mapping

from teola_adapters.simulated.embedding import SimEmbedder
from teola_adapters.simulated.llm import Responder, SimLLM
from teola_adapters.simulated.replicas import SimReplicas
from teola_adapters.simulated.reranker import SimReranker
from teola_adapters.simulated.vectordb import SimVectorDB
from teola_core.engines.protocol import EngineSet
from teola_core.profiles.profile import Curve, LatencyProfile

# paper: 48 chunks take 1.8 s at batch 4 and 1.35 s at 16; the shape around them: MiniLM measured here
EMBEDDER = LatencyProfile(
    "embedder",
    {"embed": Curve(((1, 0.10), (2, 0.12), (4, 0.15), (8, 0.27), (16, 0.45), (32, 0.88), (64, 1.76)))},
)
# assumption: a local Postgres round trip (~10 ms), pgvector HNSW inserts and queries (~1.5-2 ms each)
VECTORDB = LatencyProfile(
    "vectordb",
    {
        "ingest": Curve(((1, 0.010), (16, 0.030), (64, 0.100), (256, 0.400))),
        "search": Curve(((1, 0.010), (4, 0.016), (16, 0.040), (64, 0.160))),
    },
)
# assumption: a cross-encoder of the embedder's size over (query, passage) pairs: its curve, a little slower
RERANKER = LatencyProfile(
    "reranker",
    {"rerank": Curve(((1, 0.10), (4, 0.16), (8, 0.26), (16, 0.46), (32, 0.90), (64, 1.78)))},
)
# derived, 7B fp16 on an RTX 3090: prefill ~14 GFLOP/token at ~55 TFLOPS; decode reads 14 GB at 936 GB/s
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
LLM_CACHE_TOKENS = 16_384  # ~8 GB of KV at 0.5 MB per token (7B, fp16) beside the weights
LLM_INSTANCES = 2  # the paper's evaluation: two instances per LLM, one per other engine


def paper_profiles() -> dict[str, LatencyProfile]:
    """The four profiles by engine name (unscaled seconds)."""
    return {p.engine: p for p in (EMBEDDER, VECTORDB, RERANKER, LLM)}


def paper_engines(
    time_scale: float = 1.0,
    prefix_cache: bool = True,
    responder: Responder | None = None,
    profiles: Mapping[str, LatencyProfile] | None = None,
) -> EngineSet:
    """Fresh simulated engines named "embedder", "vectordb", "reranker" and "llm".

    One instance of each non-LLM engine and `LLM_INSTANCES` independent LLM instances
    (`SimReplicas`: own step loop and prefix cache each), as in the paper's evaluation.
    Engines carry the unscaled profiles: `time_scale` is how the simulation spends time,
    not a property of the engines. `prefix_cache=False` is the LlamaDist baseline's.
    `profiles` (by engine name) replaces the paper's: a what-if run (`what_if.py`).
    """
    p = {**paper_profiles(), **(profiles or {})}
    llms = [
        SimLLM(
            p["llm"],
            time_scale=time_scale,
            responder=responder,
            prefix_cache=prefix_cache,
            cache_tokens=LLM_CACHE_TOKENS,
            name=f"llm#{i}",
        )
        for i in range(LLM_INSTANCES)
    ]
    return (
        EngineSet()
        .add(SimEmbedder(p["embedder"], time_scale=time_scale))
        .add(SimVectorDB(p["vectordb"], time_scale=time_scale))
        .add(SimReranker(p["reranker"], time_scale=time_scale))
        .add(SimReplicas(llms, name="llm"))
    )
