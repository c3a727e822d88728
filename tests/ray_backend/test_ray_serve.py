"""`teola serve --backend ray --ray-address ...`: the flags reach the apps, and a chain whose
engines run in Ray actors answers through the official `openai` client as it does plain."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("langchain_core")
ray = pytest.importorskip("ray")

from langchain_adapter.lc_fakes import EchoChat, format_docs, make_store  # noqa: E402
from langchain_core.output_parsers import StrOutputParser  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate  # noqa: E402

import teola  # noqa: E402
from teola.cli import main  # noqa: E402
from teola.server.app import create_app  # noqa: E402
from teola.server.app_loading import wrap_app  # noqa: E402
from teola.server.runner import BackgroundServer  # noqa: E402

PROMPT = ChatPromptTemplate.from_messages([("system", "Answer briefly."), ("human", "{context}\n\nQ: {question}")])


def test_the_flags_reach_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr("teola.server.runner.serve", lambda apps, **kw: seen.update(kw, apps=apps))
    assert main(["serve", "--backend", "ray", "--ray-address", "ray://head:10001", "mod:chain"]) == 0
    assert (seen["backend"], seen["ray_address"], seen["apps"]) == ("ray", "ray://head:10001", ["mod:chain"])
    with pytest.raises(SystemExit, match="--ray-address needs --backend ray"):
        main(["serve", "--ray-address", "auto", "mod:chain"])


def test_a_served_chain_with_engines_in_actors_answers_as_plain(ray_cluster: Any) -> None:
    import openai
    import ray_lc_engines

    ray.cloudpickle.register_pickle_by_value(ray_lc_engines)
    store = make_store()
    retriever = store.as_retriever(search_kwargs={"k": 2})
    chain = {"context": retriever | format_docs, "question": lambda q: q} | PROMPT | EchoChat() | StrOutputParser()
    engines = [(store.embeddings, ray_lc_engines.FakeEmbedder(size=32)), (store, ray_lc_engines.StoreSearch(store))]
    fast = teola.optimize(chain, backend="ray", engines=engines)
    app = wrap_app("rag", fast, backend="ray")
    try:
        with BackgroundServer(create_app([app], api_key="k")) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
            for question in ("cats and dogs", "rivers"):
                reply = client.chat.completions.create(model="rag", messages=[{"role": "user", "content": question}])
                assert reply.choices[0].message.content == chain.invoke(question)
        assert fast.runtimes.where()["vectordb:InMemoryVectorStore"].startswith("1 Ray actor(s)")
    finally:
        fast.close()
        fast.runtimes.close()


def test_the_ray_address_reaches_optimize(monkeypatch: pytest.MonkeyPatch) -> None:
    """`serve(..., ray_address=)` becomes `optimize(app, backend="ray", ray={"address": ...})`."""
    from langchain_core.runnables import RunnableLambda

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(teola, "optimize", lambda obj, **options: calls.append(options) or obj)
    wrap_app("a", RunnableLambda(str), backend="ray", ray={"address": "auto"})
    wrap_app("b", RunnableLambda(str), backend="ray")
    assert calls == [
        {"backend": "ray", "execution": "graph", "ray": {"address": "auto"}},
        {"backend": "ray", "execution": "graph"},
    ]
