"""vLLM through its OpenAI-compatible HTTP server: prefix warm-up, streamed decode, retries.

llm = VLLMHTTPEngine("http://127.0.0.1:8000", "SmolLM2-135M-Instruct")   # "teola[vllm]"
"""

from teola_adapters.vllm_http.engine import VLLMHTTPEngine, VLLMHTTPError, VLLMStats, measure_profile

__all__ = ["VLLMHTTPEngine", "VLLMHTTPError", "VLLMStats", "measure_profile"]
