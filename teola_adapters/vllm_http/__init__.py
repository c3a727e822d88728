"""vLLM through its OpenAI-compatible HTTP server: prefix warm-up, streamed decode, retries.

llm = VLLMHTTPEngine("http://127.0.0.1:8000", "SmolLM2-135M-Instruct")   # "teola[vllm]"
warmer = PrefixWarmer(llm)   # the framework adapters' prefix warm-ups, one rule (`prefix_warmer`)
"""

from teola_adapters.vllm_http.engine import VLLMHTTPEngine, VLLMHTTPError, VLLMStats, measure_profile
from teola_adapters.vllm_http.prefix_warmer import PrefixWarmer, WarmupPrompt, WarmupStats

__all__ = [
    "PrefixWarmer",
    "VLLMHTTPEngine",
    "VLLMHTTPError",
    "VLLMStats",
    "WarmupPrompt",
    "WarmupStats",
    "measure_profile",
]
