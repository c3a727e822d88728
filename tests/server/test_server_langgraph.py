"""A compiled LangGraph graph behind `teola serve`, asked through the official openai client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, TypedDict

import pytest
from langchain_core.language_models import FakeListChatModel
from server_support import API_KEY, Served

pytest.importorskip("langgraph")


class Question(TypedDict):
    question: str


class Answer(TypedDict):
    answer: str


class State(Question, Answer):
    pass


def build_graph() -> Any:
    from langgraph.graph import END, START, StateGraph

    model = FakeListChatModel(responses=["Paris is the capital of France."])

    def answer(state: State) -> dict[str, str]:
        return {"answer": f"{state['question']} -> {model.invoke(state['question']).content}"}

    builder = StateGraph(State, input_schema=Question, output_schema=Answer)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    builder.add_edge("answer", END)
    return builder.compile()


@pytest.fixture(scope="module")
def served_graph() -> Iterator[Served]:
    from teola.server import BackgroundServer, create_app, wrap_app

    graph = build_graph()
    server = BackgroundServer(create_app([wrap_app("graph", graph)], api_key=API_KEY))
    url = server.start()
    try:
        yield Served(url, {"graph": graph}, None, None)
    finally:
        server.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_a_served_graph_answers_its_final_state(served_graph: Served, stream: bool) -> None:
    expected = served_graph.apps["graph"].invoke({"question": "Capital of France?"})
    client = served_graph.openai()
    messages = [{"role": "user", "content": "Capital of France?"}]
    if stream:
        chunks = client.chat.completions.create(model="graph", messages=messages, stream=True)
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        content = client.chat.completions.create(model="graph", messages=messages).choices[0].message.content
    assert json.loads(content) == expected == {"answer": "Capital of France? -> Paris is the capital of France."}


def test_a_served_graph_is_optimized_by_teola() -> None:
    from teola.server import wrap_app
    from teola_langchain.langgraph import OptimizedGraph

    assert isinstance(wrap_app("graph", build_graph()).graph, OptimizedGraph)  # type: ignore[attr-defined]


def test_a_served_graph_holds_model_calls_its_busy_server_cannot_run() -> None:
    """`teola serve` end to end, with no option given: a LangGraph map-reduce graph whose
    model is `ChatOpenAI` on a simulated vLLM-like server that runs 2 requests at once,
    asked by 6 clients at once through the official openai client. Answers equal the
    plain graph's, and once Teola has read the server's `/metrics` the calls beyond what
    it runs wait in Teola (earliest request first) instead of in the server's queue."""
    import asyncio
    import re

    import httpx

    from teola.server import BackgroundServer, create_app, wrap_app
    from teola_adapters.simulated.servers import SimServers
    from teola_examples import langgraph_map_reduce as example

    langchain_openai = pytest.importorskip("langchain_openai")
    inputs = example.inputs(6, documents=4)
    with SimServers(time_scale=0.02, max_num_seqs=2) as sim:

        def graph() -> Any:  # a model (and HTTP client) per event loop: the test's, the server's
            options = {"api_key": "x", "model": "sim", "temperature": 0, "max_tokens": 16}
            llm = langchain_openai.ChatOpenAI(base_url=sim.base_url, http_async_client=httpx.AsyncClient(), **options)
            return example.build_graph(llm)

        async def plain() -> list[Any]:
            plain_graph = graph()
            return [example.answer(out) for out in await asyncio.gather(*(plain_graph.ainvoke(x) for x in inputs))]

        expected = asyncio.run(plain())
        app = wrap_app("map_reduce", graph())
        server = BackgroundServer(create_app([app], api_key=API_KEY))
        served = Served(server.start(), {}, None, None)

        async def burst() -> list[Any]:
            client = served.async_openai(timeout=120)
            messages = [[{"role": "user", "content": json.dumps(x)}] for x in inputs]
            asks = [client.chat.completions.create(model="map_reduce", messages=m) for m in messages]
            return [example.answer(json.loads(a.choices[0].message.content)) for a in await asyncio.gather(*asks)]

        try:
            first = asyncio.run(burst())  # the server is found and read
            second = asyncio.run(burst())  # its bound is known: calls beyond it wait in Teola
            (line,) = app.graph._teola.servers()  # type: ignore[attr-defined]
        finally:
            server.stop()
    assert [tuple(map(_listed, a)) for a in first] == [tuple(map(_listed, a)) for a in expected]
    assert second == first
    held = re.search(r"\((\d+) calls held so far", line)
    assert "vLLM-like; runs 2 at once" in line and held is not None and int(held.group(1)) > 0, line


def _listed(value: Any) -> Any:
    """A value as JSON gives it back (tuples as lists)."""
    return json.loads(json.dumps(value))
