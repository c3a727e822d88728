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
