"""vLLM in this process (its async engine): prefix warm-up, streamed decode, priorities; for Ray actors.

llm = VLLMLocalEngine("/models/SmolLM2-135M-Instruct", max_model_len=2048)   # needs `vllm`
pool = RayEnginePool(VLLMLocalFactory("/models/SmolLM2-135M-Instruct"), num_gpus=1)

Modules: `engine` (the engine), `factory` (its picklable recipe for Ray actors),
`request_settings` (a call as a vLLM request), `stats`, `errors`, `dependency` (importing vLLM).
"""

from teola_adapters.vllm_local.dependency import import_vllm
from teola_adapters.vllm_local.engine import VLLMLocalEngine
from teola_adapters.vllm_local.errors import VLLMLocalError
from teola_adapters.vllm_local.factory import VLLMLocalFactory
from teola_adapters.vllm_local.stats import VLLMLocalStats

__all__ = ["VLLMLocalEngine", "VLLMLocalError", "VLLMLocalFactory", "VLLMLocalStats", "import_vllm"]
