"""`teola serve` with LlamaIndex apps: the official openai client gets the app's answer."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

if any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn", "openai", "prometheus_client")):
    pytest.skip("the serve extra is not installed", allow_module_level=True)

import openai
from li_fakes import make_index, make_llm
from llama_index.core import PromptTemplate

from teola.server import BackgroundServer, create_app, wrap_app
from teola.server.framework_apps import LlamaIndexApp

HAS_PIPELINE = importlib.util.find_spec("llama_index.core.query_pipeline") is not None


def _apps() -> dict[str, Any]:
    apps: dict[str, Any] = {"qa": make_index().as_query_engine(llm=make_llm())}
    if HAS_PIPELINE:
        from llama_index.core.query_pipeline import QueryPipeline

        prompt = PromptTemplate("Answer briefly: {question}")
        apps["pipe"] = QueryPipeline(chain=[prompt, make_llm(max_tokens=8)])
    return apps


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, dict[str, Any]]]:
    originals = _apps()
    apps = [wrap_app(name, obj) for name, obj in originals.items()]
    assert all(isinstance(a, LlamaIndexApp) for a in apps)
    server = BackgroundServer(create_app(apps))
    url = server.start()
    try:
        yield url, originals
    finally:
        server.stop()


def test_query_engine_answers_as_the_original(served: tuple[str, dict[str, Any]]) -> None:
    url, originals = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    question = "what do cats do?"
    reply = client.chat.completions.create(model="qa", messages=[{"role": "user", "content": question}])
    assert reply.choices[0].message.content == str(originals["qa"].query(question))


@pytest.mark.skipif(not HAS_PIPELINE, reason="QueryPipeline exists up to llama-index-core 0.12")
def test_pipeline_answers_as_the_original_and_streams(served: tuple[str, dict[str, Any]]) -> None:
    url, originals = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    expected = str(originals["pipe"].run(question="why is the sky blue"))
    reply = client.completions.create(model="pipe", prompt="why is the sky blue")
    assert reply.choices[0].text == expected
    chunks = client.chat.completions.create(
        model="pipe", messages=[{"role": "user", "content": "why is the sky blue"}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
