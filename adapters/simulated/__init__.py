"""Simulated engines driven by latency profiles, for benchmarks and scheduler tests.

Outputs are deterministic functions of inputs (never of batching, order or timing), so
optimized and unoptimized runs can be compared for equality; latency follows a
`LatencyProfile`, scaled by `time_scale` (0: no waiting at all).
"""

from teola_adapters.simulated.clock import EngineStats, SimClock
from teola_adapters.simulated.embedding import SimEmbedder
from teola_adapters.simulated.llm import LLMStats, PrefixCache, SimLLM, pseudo_words, token_pieces, tokens_of
from teola_adapters.simulated.paper_profiles import paper_engines, paper_profiles
from teola_adapters.simulated.reranker import SimReranker
from teola_adapters.simulated.vectordb import SimVectorDB

__all__ = [
    "EngineStats",
    "LLMStats",
    "PrefixCache",
    "SimClock",
    "SimEmbedder",
    "SimLLM",
    "SimReranker",
    "SimVectorDB",
    "paper_engines",
    "paper_profiles",
    "pseudo_words",
    "token_pieces",
    "tokens_of",
]
