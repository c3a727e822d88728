"""llama.cpp LLM engine (SmolLM2-135M-Instruct by default) with a real partial prefill.

llm = LlamaCppEngine()                      # needs "teola[local]"
profile = await measure_profile(llm)        # prefill over tokens, decode over sequences
"""

from teola_adapters.llamacpp.engine import (
    LlamaCppEngine,
    LlamaCppError,
    LlamaCppStats,
    SavedState,
    StateCache,
    default_model_path,
)
from teola_adapters.llamacpp.profiling import measure_profile

__all__ = [
    "LlamaCppEngine",
    "LlamaCppError",
    "LlamaCppStats",
    "SavedState",
    "StateCache",
    "default_model_path",
    "measure_profile",
]
