"""What `teola.optimize` makes of LangGraph objects, chains as nodes, and what `explain()` says."""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from langchain.agents import create_agent
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableParallel
from langchain_core.tools import tool
from langgraph.graph import START, StateGraph
from langgraph.prebuilt import ToolNode
from lg_fakes import EchoChat, masked

import teola
from teola_langchain.agents import OptimizedAgent, TeolaMiddleware
from teola_langchain.langgraph import OptimizedGraph
from teola_langchain.runnable import TeolaRunnable


class State(TypedDict, total=False):
    question: str
    answer: str
    shout: str


@tool
def noop(x: str) -> str:
    """Returns x."""
    return x


def mixed() -> Any:
    """A chain node, a function node, a subgraph node and a tool node."""
    llm = EchoChat()
    chain = RunnableParallel(
        answer=ChatPromptTemplate.from_messages([("human", "q {question}")]) | llm | StrOutputParser()
    )
    inner = StateGraph(State)
    inner.add_node("shout", lambda s: {"shout": s["answer"].upper()})
    inner.add_edge(START, "shout")
    b = StateGraph(State)
    b.add_node("answer", chain)
    b.add_node("inner", inner.compile())
    b.add_node("echo", lambda s: {"answer": s["answer"] + "!"})
    b.add_node("tools", ToolNode([noop]))
    b.add_edge(START, "answer")
    b.add_edge("answer", "inner")
    b.add_edge("inner", "echo")
    return b.compile()


def test_chain_nodes_go_through_teola_optimize_when_asked() -> None:
    graph = mixed()
    plain_bound = graph.nodes["answer"].bound
    fast = teola.optimize(graph, runnable_nodes=True)
    assert isinstance(fast.nodes["answer"].bound, TeolaRunnable)
    assert graph.nodes["answer"].bound is plain_bound  # the user's graph keeps its chain
    assert fast.nodes["echo"] is graph.nodes["echo"] and fast.nodes["inner"] is graph.nodes["inner"]
    question = {"question": "how are you"}
    assert fast.invoke(question) == graph.invoke(question)
    assert asyncio.run(fast.ainvoke(question)) == asyncio.run(graph.ainvoke(question))
    modes = ["values", "updates"]
    assert [masked(c) for c in fast.stream(question, stream_mode=modes)] == [
        masked(c) for c in graph.stream(question, stream_mode=modes)
    ]
    assert "- answer: chain (RunnableParallel): traced by teola.optimize (LCEL)" in fast.explain()
    fast.close()


def test_by_default_chain_nodes_run_as_written_and_explain_says_what_each_node_is() -> None:
    fast = teola.optimize(mixed())
    assert fast.nodes["answer"].bound is fast.original.nodes["answer"].bound
    text = fast.explain()
    for line in (
        "- answer: chain (RunnableParallel): run by LangChain as written",
        "- inner: subgraph (CompiledStateGraph): run by LangGraph",
        "- echo: function (RunnableCallable): run as written; the model calls it makes are scheduled by Teola",
        "- tools: tools (ToolNode): run by LangGraph",
        "runnable_nodes=True",
        "learned from each model's server (async runs)",
        "== mermaid (the graph as LangGraph draws it) ==\n---",
        "none recorded yet",
    ):
        assert line in text, line
    assert "model_concurrency=None holds nothing" in teola.optimize(mixed(), model_concurrency=None).explain()


def test_agents_with_the_middleware_keep_their_path_and_others_become_optimized_graphs() -> None:
    with_middleware = create_agent(EchoChat(), [noop], middleware=[TeolaMiddleware()])
    assert isinstance(teola.optimize(with_middleware), OptimizedAgent)
    without = create_agent(EchoChat(), [noop])
    fast = teola.optimize(without)
    assert isinstance(fast, OptimizedGraph) and isinstance(fast, type(without))
    question = {"messages": [("user", "hello you")]}
    assert [m.content for m in fast.invoke(question)["messages"]] == [
        m.content for m in without.invoke(question)["messages"]
    ]
    assert fast.calls_on_graph == 1
    assert "TeolaMiddleware" not in teola.optimize(mixed()).explain()


def test_options_are_checked() -> None:
    for bad in (0, "16", 2.5, True):
        with pytest.raises(ValueError, match="model_concurrency must be 'auto', None or an int >= 1"):
            teola.optimize(mixed(), model_concurrency=bad)
    with pytest.raises(TypeError, match="unexpected keyword argument 'policy'"):
        teola.optimize(mixed(), policy="fifo")
    with pytest.raises(ValueError, match=r"optimize\(graph, backend=...\) applies to the graph's LCEL chain nodes"):
        teola.optimize(mixed(), backend="reference")
    with pytest.raises(ValueError, match="unknown backend 'dask'"):
        teola.optimize(mixed(), runnable_nodes=True, backend="dask")


def test_chain_options_reach_the_chain_nodes() -> None:
    fast = teola.optimize(mixed(), runnable_nodes=True, backend="reference")
    assert fast.chains["answer"].backend == "reference"
    question = {"question": "how are you"}
    assert fast.invoke(question) == fast.original.invoke(question)
    assert "- answer: chain (RunnableParallel): traced by teola.optimize (LCEL); backend reference, engines: " in (
        fast.explain()
    )
    fast.close()
