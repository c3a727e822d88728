"""LangGraph graphs on `backend="ray"`: the same answers as plain, the chains' Teola engines in actors.

`teola.optimize(graph, runnable_nodes=True, backend="ray", ...)` gives the Ray options to
the LCEL chains of the graph's nodes: their Teola engines (given with `engines=`) run in
Ray actors placed by resource; LangGraph, the function nodes, the chains' own model and
the gate stay in the driver. The options are checked for the graph as a whole.
"""

from __future__ import annotations

import asyncio
from operator import itemgetter
from typing import Any, TypedDict

import pytest

pytest.importorskip("langgraph")
ray = pytest.importorskip("ray")

from langchain_adapter.lc_fakes import EchoChat, format_docs, make_store  # noqa: E402
from langchain_core.output_parsers import StrOutputParser  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate  # noqa: E402
from langchain_core.runnables import RunnableLambda  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from ray_lc_engines import FakeEmbedder, StoreSearch  # noqa: E402

import teola  # noqa: E402

PROMPT = ChatPromptTemplate.from_messages([("system", "Answer briefly."), ("human", "{context}\n\nQ: {question}")])
QUESTIONS = [{"question": f"  {topic} {i} "} for i, topic in enumerate(["cats", "rivers", "chess", "jazz"] * 5)]
EMBED, SEARCH = "embed:DeterministicFakeEmbedding", "vectordb:InMemoryVectorStore"


class State(TypedDict, total=False):
    question: str
    answer: str
    words: int


@pytest.fixture
def by_value(ray_cluster: Any) -> None:
    """The test engines ship to the workers by value."""
    import ray_lc_engines

    ray.cloudpickle.register_pickle_by_value(ray_lc_engines)


def rag(store: Any) -> Any:
    """An LCEL chain as a node: retrieval, prompt, the app's model, parser; a state update out."""
    context = itemgetter("question") | store.as_retriever(search_kwargs={"k": 2}) | format_docs
    answer = {"context": context, "question": itemgetter("question")} | PROMPT | EchoChat() | StrOutputParser()
    return answer | RunnableLambda(lambda text: {"answer": text})


def graph(store: Any, *, chains: int = 1) -> Any:
    """prepare (a function) -> rag (a chain) [-> rag2 (another chain)] -> count (a function)."""
    b = StateGraph(State)
    b.add_node("prepare", lambda s: {"question": s["question"].strip()})
    b.add_node("rag", rag(store))
    b.add_node("count", lambda s: {"words": len(s["answer"].split())})
    b.add_edge(START, "prepare")
    b.add_edge("prepare", "rag")
    if chains == 2:
        other = ChatPromptTemplate.from_messages([("human", "again: {answer}")]) | EchoChat() | StrOutputParser()
        b.add_node("rag2", other | RunnableLambda(lambda text: {"answer": text}))
        b.add_edge("rag", "rag2")
        b.add_edge("rag2", "count")
    else:
        b.add_edge("rag", "count")
    b.add_edge("count", END)
    return b.compile()


def engines_of(store: Any) -> list[tuple[Any, Any]]:
    return [(store.embeddings, FakeEmbedder(size=32)), (store, StoreSearch(store))]


@pytest.mark.usefixtures("by_value")
def test_a_graphs_chain_engines_run_where_their_resources_say(resource_nodes: dict[str, str]) -> None:
    store = make_store()
    plain = graph(store)
    placement = {"engines": {FakeEmbedder: {"resources": {"nodeA": 1}}, SEARCH: {"resources": {"nodeB": 1}}}}
    fast = teola.optimize(plain, runnable_nodes=True, backend="ray", ray=placement, engines=engines_of(store))
    try:
        expected = plain.batch(QUESTIONS)
        assert asyncio.run(fast.abatch(QUESTIONS)) == expected  # async: the caller's loop
        assert fast.batch(QUESTIONS) == expected  # sync: LangGraph's threads, the chain's own loop
        chain = fast.chains["rag"]
        assert chain.where() == {
            "llm:EchoChat": "driver",
            EMBED: "1 Ray actor(s), each CPU=1, nodeA=1",
            SEARCH: "1 Ray actor(s), each CPU=1, nodeB=1",
        }
        pools = chain.runtimes.placed.pools
        for engine, node in ((EMBED, "nodeA"), (SEARCH, "nodeB")):
            assert [i.node_id for i in pools[engine].infos if i] == [resource_nodes[node]]
            assert sum(pools[engine].served) == 2 * len(QUESTIONS)  # every query's call ran in that actor
        assert f"{SEARCH} (1 Ray actor(s), each CPU=1, nodeB=1)" in fast.explain()
    finally:
        fast.close()
    assert pools[EMBED].states == pools[SEARCH].states == ("closed",)  # close() stops the chains' actors


def test_options_apply_to_the_graph_as_a_whole() -> None:
    """A key or pair must match some chain's engines (not every chain's); others fail naming it."""
    store = make_store()
    two = graph(store, chains=2)
    fast = teola.optimize(
        two,
        runnable_nodes=True,
        backend="ray",
        engines=engines_of(store),
        ray={"engines": {SEARCH: {"resources": {"nodeB": 1}}}},  # only rag's engine: rag2 has none of it
    )
    assert set(fast.chains) == {"rag", "rag2"} and set(fast.chains["rag2"].where().values()) == {"driver"}
    fast.close()
    with pytest.raises(ValueError, match=r"ray=: engines names 'vectordb:Nope', which this app does not use"):
        teola.optimize(two, runnable_nodes=True, backend="ray", ray={"engines": {"vectordb:Nope": {}}})
    with pytest.raises(ValueError, match="engines= names components that no traced step runs on an engine"):
        teola.optimize(two, runnable_nodes=True, engines=[(EchoChat(), FakeEmbedder(size=32))])
    with pytest.raises(ValueError, match=r"optimize\(graph, backend=..., ray=...\) .* add runnable_nodes=True"):
        teola.optimize(two, backend="ray", ray={})
    with pytest.raises(ValueError, match="ray= options need backend='ray'"):
        teola.optimize(two, runnable_nodes=True, ray={})
    with pytest.raises(TypeError, match="unexpected keyword argument 'rays'"):
        teola.optimize(two, runnable_nodes=True, backend="ray", rays={})
