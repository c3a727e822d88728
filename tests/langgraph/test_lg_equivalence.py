"""`teola.optimize(graph)` gives what the graph gives: final states, streams in every mode, errors.

Each case builds a fresh compiled graph twice (closures with counters, checkpointers and
caches are per build), runs one plain and one through `teola.optimize`, sync and async,
and compares. Ids, timestamps and addresses are masked (they differ between two plain
runs too); where LangGraph streams parallel branches in completion order (a `Send`
fan-out), the chunks are compared as a multiset, as two plain runs would have to be.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langgraph.cache.memory import InMemoryCache
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_stream_writer
from langgraph.errors import GraphRecursionError
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import CachePolicy, Command, RetryPolicy, Send, interrupt
from lg_fakes import EchoChat, masked

import teola
from teola_langchain.langgraph import OptimizedGraph

MODES: list[Any] = ["values", "updates", "messages", "custom", "debug", ["updates", "messages", "custom"]]


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[bool], Any]  # sync nodes? -> a fresh compiled graph
    input: Any
    ordered: bool = True  # False: parallel branches stream in completion order
    config: dict[str, Any] | None = None
    context: Any = None


# -- the graphs --------------------------------------------------------------------------------
class FanState(TypedDict):
    items: list[str]
    answers: Annotated[list[str], operator.add]
    summary: str


class Item(TypedDict):
    item: str


def fan_out(sync: bool) -> Any:
    """`Send` per item to a node that calls the model and writes custom stream data, then a chain."""
    llm = EchoChat()
    chain = ChatPromptTemplate.from_messages([("human", "sum {xs}")]) | llm | StrOutputParser()

    def one(state: Item) -> dict[str, Any]:
        get_stream_writer()({"item": state["item"]})
        return {"answers": [llm.invoke(state["item"]).content]}

    async def aone(state: Item) -> dict[str, Any]:
        get_stream_writer()({"item": state["item"]})
        return {"answers": [(await llm.ainvoke(state["item"])).content]}

    def reduce(state: FanState) -> dict[str, Any]:
        return {"summary": chain.invoke({"xs": " ".join(state["answers"])})}

    async def areduce(state: FanState) -> dict[str, Any]:
        return {"summary": await chain.ainvoke({"xs": " ".join(state["answers"])})}

    b = StateGraph(FanState)
    b.add_node("one", one if sync else aone)
    b.add_node("reduce", reduce if sync else areduce)
    b.add_conditional_edges(START, lambda s: [Send("one", {"item": i}) for i in s["items"]], ["one"])
    b.add_edge("one", "reduce")
    b.add_edge("reduce", END)
    return b.compile()


class TextState(TypedDict, total=False):
    text: str
    name: str
    answer: str


def subgraph(sync: bool) -> Any:
    """A compiled graph as a node (its model call belongs to the parent's run)."""
    llm = EchoChat()

    def ask(state: TextState) -> dict[str, Any]:
        return {"answer": llm.invoke(state["text"]).content}

    async def aask(state: TextState) -> dict[str, Any]:
        return {"answer": (await llm.ainvoke(state["text"])).content}

    inner = StateGraph(TextState)
    inner.add_node("ask", ask if sync else aask)
    inner.add_edge(START, "ask")
    outer = StateGraph(TextState)
    outer.add_node("inner", inner.compile())
    outer.add_node("shout", lambda s: {"answer": s["answer"].upper()})
    outer.add_edge(START, "inner")
    outer.add_edge("inner", "shout")
    return outer.compile()


def retried_and_cached(sync: bool) -> Any:
    """A node that fails once then succeeds (retry policy), and a cached node (runs once per input)."""
    llm = EchoChat()
    calls = {"flaky": 0, "cached": 0}

    def flaky(state: TextState) -> dict[str, Any]:
        calls["flaky"] += 1
        if calls["flaky"] == 1:
            raise ConnectionError("first try fails")
        return {"answer": llm.invoke(state["text"]).content}

    def cached(state: TextState) -> dict[str, Any]:
        calls["cached"] += 1
        return {"name": f"{state['answer']} #{calls['cached']}"}

    b = StateGraph(TextState)
    b.add_node("flaky", flaky, retry_policy=RetryPolicy(initial_interval=0.0, jitter=False))
    b.add_node("cached", cached, cache_policy=CachePolicy())
    b.add_edge(START, "flaky")
    b.add_edge("flaky", "cached")
    return b.compile(cache=InMemoryCache())


@dataclass
class Ctx:
    greeting: str


def with_context(sync: bool) -> Any:
    llm = EchoChat()

    def greet(state: TextState, runtime: Runtime[Ctx]) -> dict[str, Any]:
        return {"answer": llm.invoke(f"{runtime.context.greeting} {state['text']}").content}

    async def agreet(state: TextState, runtime: Runtime[Ctx]) -> dict[str, Any]:
        return {"answer": (await llm.ainvoke(f"{runtime.context.greeting} {state['text']}")).content}

    b = StateGraph(TextState, context_schema=Ctx)
    b.add_node("greet", greet if sync else agreet)
    b.add_edge(START, "greet")
    return b.compile()


def endless(sync: bool) -> Any:
    """Loops until the recursion limit stops it."""
    b = StateGraph(TextState)
    b.add_node("again", lambda s: {"text": s["text"] + "!"})
    b.add_edge(START, "again")
    b.add_edge("again", "again")
    return b.compile()


def failing(sync: bool) -> Any:
    """The model raises: the error reaches the caller as LangGraph raises it."""
    llm = EchoChat(fail_on="boom")

    def ask(state: TextState) -> dict[str, Any]:
        return {"answer": llm.invoke(state["text"]).content}

    async def aask(state: TextState) -> dict[str, Any]:
        return {"answer": (await llm.ainvoke(state["text"])).content}

    b = StateGraph(TextState)
    b.add_node("ask", ask if sync else aask)
    b.add_edge(START, "ask")
    return b.compile()


CASES = [
    Case("fan_out", fan_out, {"items": ["a b", "c d", "e f"]}, ordered=False),
    Case("subgraph", subgraph, {"text": "hello there"}),
    Case("retry_cache", retried_and_cached, {"text": "x y"}),
    Case("context", with_context, {"text": "world"}, context=Ctx(greeting="hi")),
    Case("recursion_limit", endless, {"text": "go"}, config={"recursion_limit": 5}),
    Case("error", failing, {"text": "a boom b"}),
]


# -- running -----------------------------------------------------------------------------------
def _stream(graph: Any, case: Case, sync: bool, **kwargs: Any) -> list[str]:
    """The masked chunks (or the masked error)."""
    args = (case.input, case.config)
    chunks: list[Any] = []
    try:
        if sync:
            chunks.extend(graph.stream(*args, context=case.context, **kwargs))
        else:

            async def collect() -> None:
                async for chunk in graph.astream(*args, context=case.context, **kwargs):
                    chunks.append(chunk)

            asyncio.run(collect())
    except Exception as exc:
        chunks.append(exc)
    return [masked(c) for c in chunks]


def _same(got: list[str], want: list[str], ordered: bool) -> None:
    assert (got if ordered else sorted(got)) == (want if ordered else sorted(want))


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: "+".join(m) if isinstance(m, list) else m)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_streams_are_the_graphs(case: Case, mode: Any, sync: bool) -> None:
    want = _stream(case.build(sync), case, sync, stream_mode=mode)
    got = _stream(teola.optimize(case.build(sync)), case, sync, stream_mode=mode)
    _same(got, want, case.ordered)
    assert want or mode not in ("values", "updates"), "the graph streamed nothing: the case tests nothing"


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_subgraph_streams_and_final_states(case: Case, sync: bool) -> None:
    for kwargs in ({"stream_mode": ["values", "updates", "messages"], "subgraphs": True}, {}):
        want = _stream(case.build(sync), case, sync, **kwargs)
        got = _stream(teola.optimize(case.build(sync)), case, sync, **kwargs)
        _same(got, want, case.ordered)
    if case.name == "recursion_limit":
        with pytest.raises(GraphRecursionError):
            teola.optimize(case.build(True)).invoke(case.input, case.config)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_calls_wait_for_their_turn_and_answers_stay(sync: bool) -> None:
    """One model call in flight at a time: the same answers, each call admitted by Teola."""
    case = CASES[0]
    want = _stream(fan_out(sync), case, sync, stream_mode="values")
    fast = teola.optimize(fan_out(sync), model_concurrency=1)
    assert _stream(fast, case, sync, stream_mode="values") == want
    assert fast.calls_on_graph == 1
    assert fast._teola.model_calls == 4  # three items and the reduce chain's call
    assert "timed primitives of 1 queries" in fast.explain()  # the run's model calls, per engine


class AskState(TypedDict, total=False):
    question: str
    name: str
    answer: str


def asking(checkpointer: Any) -> Any:
    """Interrupts for a name, then answers with the model."""
    llm = EchoChat()

    def ask(state: AskState) -> dict[str, Any]:
        name = interrupt(f"who asks {state['question']!r}?")
        return {"name": name, "answer": llm.invoke(f"{name} asks {state['question']}").content}

    b = StateGraph(AskState)
    b.add_node("ask", ask)
    b.add_edge(START, "ask")
    b.add_edge("ask", END)
    return b.compile(checkpointer=checkpointer)


def test_interrupt_resume_threads_and_state_history() -> None:
    def session(graph: Any) -> list[str]:
        seen = []
        for thread in ("t1", "t2"):
            config = {"configurable": {"thread_id": thread}}
            seen.append(graph.invoke({"question": f"why {thread}"}, config))
            seen.append(graph.get_state(config))
            seen.append(list(graph.stream(Command(resume=f"bob-{thread}"), config, stream_mode="updates")))
            seen.append(graph.get_state(config).values)
            seen.append([s.next for s in graph.get_state_history(config)])
        return [masked(x) for x in seen]

    plain = asking(InMemorySaver())
    fast = teola.optimize(asking(InMemorySaver()))
    assert session(fast) == session(plain)


def test_async_interrupt_resume() -> None:
    async def session(graph: Any) -> list[str]:
        config = {"configurable": {"thread_id": "a"}}
        first = await graph.ainvoke({"question": "how"}, config)
        second = await graph.ainvoke(Command(resume="ann"), config)
        return [masked(first), masked(second), masked((await graph.aget_state(config)).values)]

    assert asyncio.run(session(teola.optimize(asking(InMemorySaver())))) == asyncio.run(
        session(asking(InMemorySaver()))
    )


def test_batch_and_abatch_are_the_graphs() -> None:
    inputs = [{"items": ["a b"]}, {"items": ["c", "d e"]}]
    want = [masked(x) for x in fan_out(True).batch(inputs)]
    fast = teola.optimize(fan_out(True))
    assert [masked(x) for x in fast.batch(inputs)] == want
    assert [masked(x) for x in asyncio.run(teola.optimize(fan_out(False)).abatch(inputs))] == [
        masked(x) for x in asyncio.run(fan_out(False).abatch(inputs))
    ]
    assert fast.calls_on_graph == 2


def test_the_optimized_graph_is_the_graphs_class_and_the_original_is_untouched() -> None:
    graph = fan_out(False)
    before = dict(graph.__dict__)
    fast = teola.optimize(graph)
    assert isinstance(fast, type(graph)) and isinstance(fast, OptimizedGraph)
    assert graph.__dict__ == before and type(graph).__name__ == "CompiledStateGraph"
    assert fast.nodes is graph.nodes and fast.checkpointer is graph.checkpointer
    configured = fast.with_config({"recursion_limit": 7})
    assert isinstance(configured, OptimizedGraph) and configured.config["recursion_limit"] == 7
    assert asyncio.run(configured.ainvoke({"items": ["x"]}))["summary"] == "echo x echo sum"
    assert teola.optimize(fast).original is graph


def _tree(run: Any, depth: int = 0) -> list[str]:
    """A traced run and its children: name, type, tags, metadata keys, inputs, outputs, the error's
    type and message (its traceback's frames are the wrappers' own, as under any wrapper)."""
    error = run.error.splitlines()[0] if run.error else None
    line = (
        f"{'  ' * depth}{run.name} {run.run_type} {sorted(run.tags or [])} "
        f"{sorted((run.extra or {}).get('metadata', {}))} {masked(run.inputs)} {masked(run.outputs)} {error}"
    )
    children = sorted((_tree(c, depth + 1) for c in run.child_runs), key=lambda t: t[0])
    return [line, *(line for child in children for line in child)]


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
@pytest.mark.parametrize("case", [c for c in CASES if c.name in ("fan_out", "subgraph", "error")], ids=lambda c: c.name)
def test_traces_are_the_graphs(case: Case, sync: bool) -> None:
    """What a tracer (LangSmith's, say) records: the same tree of runs, inputs and outputs."""
    from langchain_core.tracers.context import collect_runs

    def traced(graph: Any) -> list[list[str]]:
        with collect_runs() as collector:
            _stream(graph, case, sync, stream_mode="values")
        return sorted(_tree(run) for run in collector.traced_runs)  # roots end in completion order

    want = traced(case.build(sync))
    assert traced(teola.optimize(case.build(sync))) == want
    assert any("ChatModel" in line or "echo-chat" in line or "EchoChat" in line for t in want for line in t)
