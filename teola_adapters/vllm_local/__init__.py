"""vLLM in this process (its async engine): prefix warm-up, streamed decode, priorities; for Ray actors.

llm = VLLMLocalEngine("/models/SmolLM2-135M-Instruct", max_model_len=2048)   # needs `vllm`
pool = RayEnginePool(VLLMLocalFactory("/models/SmolLM2-135M-Instruct"), num_gpus=1)
"""

from teola_adapters.vllm_local.engine import (
    VLLMLocalEngine,
    VLLMLocalError,
    VLLMLocalFactory,
    VLLMLocalStats,
    import_vllm,
)

__all__ = ["VLLMLocalEngine", "VLLMLocalError", "VLLMLocalFactory", "VLLMLocalStats", "import_vllm"]
