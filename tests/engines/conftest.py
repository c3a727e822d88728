"""Fixtures the llama.cpp engine tests share."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest


@pytest.fixture(scope="module")
def reference() -> Iterator[Callable[..., str]]:
    """llama.cpp's own completion on a fresh context, with the engine's evaluation chunk (one
    thread: robust to a busy machine; the engine's thread count must not change its texts).
    Greedy unless the call passes its own `temperature`."""
    from teola_adapters.llamacpp import reference_llama

    llm = reference_llama(n_ctx=2048, n_batch=32, n_ubatch=32, n_threads=1, n_threads_batch=1, verbose=False)

    def complete(text: str, max_tokens: int, **kwargs: object) -> str:
        llm.reset()
        kwargs.setdefault("temperature", 0)
        return llm.create_completion(text, max_tokens=max_tokens, **kwargs)["choices"][0]["text"]

    yield complete
    llm.close()
