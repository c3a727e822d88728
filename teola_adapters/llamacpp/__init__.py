"""llama.cpp LLM engine (SmolLM2-135M-Instruct by default) with a real partial prefill.

llm = LlamaCppEngine()                      # needs "teola[local]"
profile = await measure_profile(llm)        # prefill over tokens, decode over sequences
llm.retain("agent-7", prompt + answer, ttl_s=2.5)   # KV retention for an agent's next call
"""

from teola_adapters.llamacpp.engine import LlamaCppEngine, LlamaCppError, LlamaCppStats
from teola_adapters.llamacpp.loading import default_model_path, model_params, reference_llama
from teola_adapters.llamacpp.profiling import calibrate_decode, measure_profile
from teola_adapters.llamacpp.state_cache import SavedState, StateCache

__all__ = [
    "LlamaCppEngine",
    "LlamaCppError",
    "LlamaCppStats",
    "SavedState",
    "StateCache",
    "calibrate_decode",
    "default_model_path",
    "measure_profile",
    "model_params",
    "reference_llama",
]
