"""The picklable recipe of a `VLLMLocalEngine`: what a `RayEnginePool` ships to its actors."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from teola_adapters.vllm_local.engine import VLLMLocalEngine


class VLLMLocalFactory:
    """Builds a `VLLMLocalEngine` where it is called: the picklable recipe a `RayEnginePool`
    ships to its actors (each loads the model in its own process).

    env: environment variables set in that process before vLLM starts (vLLM reads some
    settings only there, e.g. `VLLM_CPU_KVCACHE_SPACE`, `VLLM_CPU_NUM_OF_RESERVED_CPU`).

        factory = VLLMLocalFactory("/models/SmolLM2-135M-Instruct", max_model_len=2048)
        engines = EngineSet().add(RayEnginePool(factory, instances=2, num_gpus=1))
    """

    def __init__(self, model: str, *, env: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        self.model = str(model)
        self.env = dict(env or {})
        self.kwargs = kwargs

    def __call__(self) -> VLLMLocalEngine:
        os.environ.update(self.env)
        return VLLMLocalEngine(self.model, **self.kwargs)

    def __repr__(self) -> str:
        return f"VLLMLocalFactory({self.model!r}, name={self.kwargs.get('name', 'llm')!r})"
