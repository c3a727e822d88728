"""Decode pipelining taps a chat model's tokens only where that leaves LangChain's run
(`runs.tap_leaves_same_run`): a model whose streamed response carries other metadata than
its plain one (as an OpenAI-compatible server's) is called plainly while a tracer records it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.output_parsers import NumberedListOutputParser
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.prompts import PromptTemplate
from lc_fakes import EchoChat, answer, make_store, outcome
from pydantic import Field
from test_lc_tracing import kinds

from teola_benchmarks.langchain.traces import TraceRecorder
from teola_core.ir.kinds import PrimitiveKind
from teola_langchain import optimize

STORE = make_store()


class MetadataChat(EchoChat):
    """Its plain response reports token usage and an id; its stream does not (as ChatOpenAI's)."""

    calls: list[str] = Field(default_factory=list)
    streaming: bool = False  # as ChatOpenAI's: True streams in invoke whatever handlers are attached

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        self.calls.append("generate")
        text = answer("\n".join(f"{m.type}: {m.text}" for m in messages), self.style, self.n_items, stop)
        usage = {"input_tokens": 7, "output_tokens": 9, "total_tokens": 16}
        message = AIMessage(content=text, usage_metadata=usage, response_metadata={"id": "resp-1"})
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
        self.calls.append("stream")
        return super()._stream(messages, stop, run_manager, **kwargs)


def chain(model: EchoChat) -> Any:
    expand = PromptTemplate.from_template("{q}") | model | NumberedListOutputParser()
    return expand | STORE.as_retriever().map()


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_with_a_tracer_the_model_is_called_plainly_and_the_trace_is_langchains(mode: str) -> None:
    plain_model, model = MetadataChat(style="numbered", calls=[]), MetadataChat(style="numbered", calls=[])
    fast = optimize(chain(model), expected_items=3)
    try:
        assert kinds(fast.plan.main.graph).count(PrimitiveKind.PARTIAL_DECODE) == 3  # pipelined when nothing records
        inputs = [{"q": "cats"}]
        assert outcome(fast, mode, inputs) == outcome(chain(plain_model), mode, inputs)
        assert model.calls == plain_model.calls == ["generate"]
        assert "give the model streaming=True" in fast.explain()
    finally:
        fast.close()


def test_without_a_tracer_the_model_streams_into_the_map() -> None:
    plain, model = MetadataChat(style="numbered", calls=[]), MetadataChat(style="numbered", calls=[])
    fast = optimize(chain(model), expected_items=3)
    try:
        assert asyncio.run(fast.ainvoke({"q": "cats"})) == chain(plain).invoke({"q": "cats"})
        assert model.calls == ["stream"]  # its tokens reached the map as it wrote them
    finally:
        fast.close()


def test_a_model_that_streams_anyway_streams_with_a_tracer_and_traces_stay_equal() -> None:
    plain, model = (MetadataChat(style="numbered", calls=[], streaming=True) for _ in range(2))
    fast = optimize(chain(model), expected_items=3)
    try:
        recorders = TraceRecorder(), TraceRecorder()
        got = fast.invoke({"q": "dogs"}, {"callbacks": [recorders[0]]})
        assert got == chain(plain).invoke({"q": "dogs"}, {"callbacks": [recorders[1]]})
        assert model.calls == plain.calls == ["stream"]
        assert recorders[0].trees() == recorders[1].trees()
        assert "give the model streaming=True" not in fast.explain()
    finally:
        fast.close()


def test_langsmith_records_the_pipelined_map_with_its_real_input() -> None:
    """The map opens before its input exists (as LangChain's streaming opens a run); LangSmith's
    tracer waits for the input (`defers_inputs`), so it records the same runs as plain."""
    from langchain_core.tracers.langchain import LangChainTracer
    from test_lc_early_steps import _FakeClient

    trees = []
    for runnable in (chain(EchoChat(style="numbered")), optimize(chain(EchoChat(style="numbered")), expected_items=3)):
        client = _FakeClient()
        tracer = LangChainTracer(client=client, project_name="teola-test")
        asyncio.run(runnable.ainvoke({"q": "cats"}, {"callbacks": [tracer]}))
        tracer.wait_for_futures()
        trees.append(client.tree())
    assert trees[0] == trees[1]
    assert "'input': ''" not in repr(trees[1])


class FailingNumbered(EchoChat):
    """Streams its numbered list, then fails: the map after it must never appear in the trace."""

    def _stream(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
        yield from super()._stream(messages, stop, run_manager, **kwargs)
        raise ValueError("the model failed after writing its list")

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
        raise ValueError("the model failed after writing its list")


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_pipelined_map_whose_model_fails_leaves_no_run_of_its_own(mode: str) -> None:
    """The map opened beside the model (its items already retrieved) is dropped with everything
    under it when the model fails: plain LangChain never started it."""
    fast = optimize(chain(FailingNumbered(style="numbered")), expected_items=3)
    try:
        expected = outcome(chain(FailingNumbered(style="numbered")), mode, [{"q": "cats"}])
        got = outcome(fast, mode, [{"q": "cats"}])
        assert got == expected and got[0] == "raised"
        assert "RunnableEach" not in repr(got[2])
    finally:
        fast.close()


def test_langsmith_tracing_switched_on_in_the_callers_context_counts_as_a_tracer() -> None:
    """No handler passed, but the caller traced with LangSmith (`tracing_v2_enabled`'s context
    variable): the model's run is recorded, so it is called plainly, as plain LangChain calls it."""
    from langchain_core.tracers.context import tracing_v2_callback_var
    from langchain_core.tracers.langchain import LangChainTracer
    from test_lc_early_steps import _FakeClient

    plain, model = MetadataChat(style="numbered", calls=[]), MetadataChat(style="numbered", calls=[])
    fast = optimize(chain(model), expected_items=3)
    client = _FakeClient()
    token = tracing_v2_callback_var.set(LangChainTracer(client=client, project_name="teola-test"))
    try:
        assert fast.invoke({"q": "cats"}) == chain(plain).invoke({"q": "cats"})
        assert model.calls == plain.calls == ["generate"]
        assert client.runs  # the tracer did record the runs
    finally:
        tracing_v2_callback_var.reset(token)
        fast.close()
