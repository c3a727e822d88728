"""LangChain's rows of the drop-in family (`tests/drop_in_family.py`): an LCEL chain, a
compiled LangGraph graph and a `create_agent` agent with `TeolaMiddleware`, each through
`teola.optimize`: one base, the same API, the same answers."""

from __future__ import annotations

import asyncio
from operator import itemgetter
from typing import Any

import pytest
from drop_in_family import check_drop_in
from fan_out_graph import fan_out
from langchain_adapter.lc_fakes import EchoChat, format_docs, make_store
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate

import teola
from teola_langchain.agents import OptimizedAgent, TeolaMiddleware
from teola_langchain.langgraph import OptimizedGraph
from teola_langchain.runnable import TeolaRunnable

PROMPT = ChatPromptTemplate.from_messages([("human", "{context}\n\nQ: {question}")])


def test_an_lcel_chain() -> None:
    retriever = make_store().as_retriever(search_kwargs={"k": 2})
    chain = {"context": itemgetter("question") | retriever | format_docs, "question": itemgetter("question")}
    chain = chain | PROMPT | EchoChat() | StrOutputParser()
    fast = teola.optimize(chain)
    assert isinstance(fast, TeolaRunnable)
    plain = asyncio.run(check_drop_in(chain, fast, lambda app: app.ainvoke({"question": "cats"})))
    assert plain and fast.calls_on_graph > 0


def test_a_langgraph_graph() -> None:
    graph = fan_out(EchoChat())
    fast = teola.optimize(graph, model_concurrency=2)  # a bound: the gate schedules every call
    assert isinstance(fast, OptimizedGraph)

    async def run(app: Any) -> list[str]:
        return sorted((await app.ainvoke({"items": ["a", "b", "c"], "answers": []}))["answers"])

    async def check() -> None:
        await check_drop_in(graph, fast, run)
        gates = fast.where()  # the gates of this loop's model calls
        assert gates == {"llm:langchain_adapter.lc_fakes.EchoChat": "driver"}

    asyncio.run(check())


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_create_agent_agent() -> None:
    from langchain.agents import create_agent

    agent = create_agent(EchoChat(), [], middleware=[TeolaMiddleware()])
    fast = teola.optimize(agent)
    assert isinstance(fast, OptimizedAgent)

    async def run(app: Any) -> list[str]:
        return [str(m.content) for m in (await app.ainvoke({"messages": [("user", "hello")]}))["messages"]]

    asyncio.run(check_drop_in(agent, fast, run))
    assert fast.where() == {fast.engine_name: "driver"}
    assert fast.stream is not None and fast.get_state is not None  # the agent's own API, forwarded
    with pytest.raises(AttributeError, match="no attribute '_private'"):
        fast._private  # noqa: B018 - private names are the agent's own business
