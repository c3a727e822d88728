"""LangChain chains on `backend="ray"`: the same answers and callbacks as the plain chain.

The chain's own model runs in the driver (its engine is `driver_only`: it calls the model
with each query's callbacks and config); Teola engines given with `engines=` run in Ray
actors. Before engines declared this, every chain failed on Ray (the actors held an empty
copy of the driver's per-query registry).
"""

from __future__ import annotations

import asyncio
from operator import itemgetter
from typing import Any

import pytest

pytest.importorskip("langchain_core")
ray = pytest.importorskip("ray")

from langchain_adapter.lc_fakes import EchoChat, format_docs, make_store  # noqa: E402
from langchain_core.callbacks import BaseCallbackHandler  # noqa: E402
from langchain_core.output_parsers import StrOutputParser  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate  # noqa: E402
from langchain_core.runnables import RunnableLambda, RunnableParallel  # noqa: E402

import teola  # noqa: E402

PROMPT = ChatPromptTemplate.from_messages([("system", "Answer briefly."), ("human", "{context}\n\nQ: {question}")])
QUESTIONS = [{"question": f"{topic} {i}"} for i, topic in enumerate(["cats", "rivers", "chess", "jazz"] * 5)]


@pytest.fixture
def lc_engines(ray_cluster: Any) -> Any:
    import ray_lc_engines

    ray.cloudpickle.register_pickle_by_value(ray_lc_engines)
    return ray_lc_engines


class ModelStarts(BaseCallbackHandler):
    def __init__(self) -> None:
        self.starts = 0

    def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
        self.starts += 1


def simple_chain() -> Any:
    """The issue's chain: a parallel step of two lambdas, prompt | chat model | parser."""
    both = RunnableParallel(
        question=RunnableLambda(lambda x: x["question"]), context=RunnableLambda(lambda x: x["question"].upper())
    )
    return both | PROMPT | EchoChat() | StrOutputParser()


def rag_chain(store: Any) -> Any:
    retriever = store.as_retriever(search_kwargs={"k": 2})
    context = itemgetter("question") | retriever | format_docs
    return {"context": context, "question": itemgetter("question")} | PROMPT | EchoChat() | StrOutputParser()


def test_a_chain_answers_on_ray_as_plain_with_its_callbacks(ray_cluster: Any) -> None:
    chain = simple_chain()
    fast = teola.optimize(chain, backend="ray")
    try:
        plain, optimized = ModelStarts(), ModelStarts()
        expected = chain.batch(QUESTIONS, {"callbacks": [plain]})
        assert fast.batch(QUESTIONS, {"callbacks": [optimized]}) == expected  # sync: its own loop
        assert asyncio.run(fast.abatch(QUESTIONS)) == expected  # async: the caller's loop
        assert optimized.starts == plain.starts == len(QUESTIONS)
        assert set(fast.runtimes.where().values()) == {"driver"}  # only the user's model: nothing to place
    finally:
        fast.close()


def test_a_rag_chain_on_its_own_components_answers_on_ray_as_plain(ray_cluster: Any) -> None:
    """Every framework engine stays in the driver: nothing of the app's objects is copied to an actor."""
    chain = rag_chain(make_store())
    fast = teola.optimize(chain, backend="ray")
    try:
        assert set(fast.runtimes.where().values()) == {"driver"}
        assert asyncio.run(fast.abatch(QUESTIONS)) == chain.batch(QUESTIONS)
    finally:
        fast.close()
        fast.runtimes.close()


def test_teola_engines_of_a_chain_run_in_actors_and_its_model_in_the_driver(lc_engines: Any) -> None:
    store = make_store()
    chain = rag_chain(store)
    embedder, searcher = lc_engines.FakeEmbedder(size=32), lc_engines.StoreSearch(store)
    fast = teola.optimize(chain, backend="ray", engines=[(store.embeddings, embedder), (store, searcher)])
    try:
        assert asyncio.run(fast.abatch(QUESTIONS)) == chain.batch(QUESTIONS)
        where = fast.runtimes.where()
        assert where["llm:EchoChat"] == "driver"
        assert where["embed:DeterministicFakeEmbedding"] == where["vectordb:InMemoryVectorStore"]
        assert where["vectordb:InMemoryVectorStore"] == "1 Ray actor(s), each CPU=1"
    finally:
        fast.close()
        fast.runtimes.close()


def test_optimize_places_a_chains_engines_by_resource(lc_engines: Any, resource_nodes: dict[str, str]) -> None:
    store = make_store()
    chain = rag_chain(store)
    embedder, searcher = lc_engines.FakeEmbedder(size=32), lc_engines.StoreSearch(store)
    placement = {
        "engines": {
            lc_engines.FakeEmbedder: {"resources": {"nodeA": 1}, "num_replicas": 2},
            "vectordb:InMemoryVectorStore": {"resources": {"nodeB": 1}},
        }
    }
    fast = teola.optimize(
        chain, backend="ray", ray=placement, engines=[(store.embeddings, embedder), (store, searcher)]
    )
    try:
        assert asyncio.run(fast.abatch(QUESTIONS)) == chain.batch(QUESTIONS)
        pools = fast.runtimes.placed.pools
        assert {i.node_id for i in pools["embed:DeterministicFakeEmbedding"].infos if i} == {resource_nodes["nodeA"]}
        assert {i.node_id for i in pools["vectordb:InMemoryVectorStore"].infos if i} == {resource_nodes["nodeB"]}
    finally:
        fast.close()
        fast.runtimes.close()
