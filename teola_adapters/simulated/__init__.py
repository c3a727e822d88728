"""Simulated engines driven by latency profiles, for benchmarks and scheduler tests.

    engines = paper_engines(responder=FakeModel())     # the paper's setting
    run_virtual(main())                                # exact, repeatable, fast: virtual time

Outputs are deterministic functions of inputs (never of batching, order or timing);
latency follows a `LatencyProfile`, scaled by `time_scale` (0: no waiting at all). What
each engine models and where its numbers come from: `docs/simulated-engines.md`. The
OpenAI-compatible HTTP servers over these engines: `teola_adapters.simulated.servers`.
"""

from teola_adapters.simulated.clock import EngineStats, SimClock
from teola_adapters.simulated.embedding import SimEmbedder
from teola_adapters.simulated.llm import SimLLM
from teola_adapters.simulated.llm_state import LLMStats
from teola_adapters.simulated.paper_profiles import paper_engines, paper_profiles
from teola_adapters.simulated.prefix_cache import PrefixCache
from teola_adapters.simulated.replicas import SimReplicas
from teola_adapters.simulated.reranker import SimReranker
from teola_adapters.simulated.text import pseudo_words, token_pieces, tokens_of
from teola_adapters.simulated.vectordb import SimVectorDB
from teola_adapters.simulated.virtual_time import run_virtual

__all__ = [
    "EngineStats",
    "LLMStats",
    "PrefixCache",
    "SimClock",
    "SimEmbedder",
    "SimLLM",
    "SimReplicas",
    "SimReranker",
    "SimVectorDB",
    "paper_engines",
    "paper_profiles",
    "pseudo_words",
    "run_virtual",
    "token_pieces",
    "tokens_of",
]
