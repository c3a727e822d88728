"""`SummarizationMiddleware` under `teola.optimize(agent)`: summaries computed while tools run.

The agent model calls a `step` tool once per turn (`width` calls in parallel) and answers
with a digest of everything it was shown, so a different summary changes every later
message; the summary model answers with a digest of its prompt. Both are functions of
their input, so the plain agent and the optimized one must produce the same messages.
The `step` tool can wait until a summary call has started (a `Gate`): the optimized run
only gets past it if the summary was started while the tool waited.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import threading
from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("langchain.agents.middleware")

from langchain.agents import create_agent
from langchain.agents.middleware import SummarizationMiddleware
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import ToolRuntime
from langgraph.types import Command, interrupt

import teola
from teola_core.agents import AgentFeatures, Program
from teola_langchain.agents import OptimizedAgent, TeolaMiddleware


# -- models: outputs are functions of inputs ----------------------------------------------------
def digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:8]


class StepModel(BaseChatModel):
    """Calls `step` (or `noted` at `noted_step`, `ask` at `ask_step`) until `steps` turns are done."""

    steps: int = 3
    width: int = 1
    noted_step: int | None = None
    ask_step: int | None = None

    @property
    def _llm_type(self) -> str:
        return "step-model"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self.bind(**kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        results = [m for m in messages if isinstance(m, ToolMessage)]
        n = int(str(results[-1].content).split()[1]) + 1 if results else 1
        seen = digest("|".join(f"{m.type}:{m.content}" for m in messages))
        if n > self.steps:
            return ChatResult(generations=[ChatGeneration(message=AIMessage(f"done after {seen}"))])
        name = {self.noted_step: "noted", self.ask_step: "ask"}.get(n, "step")
        calls = [
            {"name": name, "args": {"n": n, "part": j}, "id": f"s{n}-{j}", "type": "tool_call"}
            for j in range(self.width)
        ]
        return ChatResult(generations=[ChatGeneration(message=AIMessage(f"step {n} after {seen}", tool_calls=calls))])


class Recorder:
    """What the summary model was asked; `hold_first` keeps the first call waiting until cancelled."""

    def __init__(self) -> None:
        self.reset()

    def reset(self, *, hold_first: bool = False) -> None:
        self.prompts: list[str] = []
        self.cancelled = 0
        self.running = 0
        self.hold_first = hold_first
        self.gate = Gate()


class Gate:
    """Opened when a summary call starts; a tool waits on it (threads in sync runs, the loop in async ones)."""

    def __init__(self) -> None:
        self.thread_event = threading.Event()
        self.loop_event = asyncio.Event()

    def open(self) -> None:
        self.thread_event.set()
        self.loop_event.set()


class SummaryModel(BaseChatModel):
    recorder: Any

    @property
    def _llm_type(self) -> str:
        return "summary-model"

    def _answer(self, messages: list[BaseMessage]) -> ChatResult:
        prompt = str(messages[-1].content)
        self.recorder.prompts.append(prompt)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(f"summary {digest(prompt)}"))])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.recorder.gate.open()
        return self._answer(messages)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        recorder = self.recorder
        recorder.gate.open()
        recorder.running += 1
        try:
            if recorder.hold_first:
                recorder.hold_first = False
                await asyncio.Event().wait()  # until cancelled
            return self._answer(messages)
        except asyncio.CancelledError:
            recorder.cancelled += 1
            raise
        finally:
            recorder.running -= 1


# -- tools ----------------------------------------------------------------------------------------
class Tools:
    """`step` waits for the recorder's gate at `wait_at` (the summary must start during the wait)."""

    def __init__(self, recorder: Recorder, pad: int = 0) -> None:
        self.recorder = recorder
        self.wait_at: int | None = None
        self.gate_opened: list[bool] = []

        def result(n: int, part: int) -> str:
            return f"step {n} part {part} " + "x" * pad

        def step(n: int, part: int) -> str:
            """Do step n (sync: waits on a thread event)."""
            if n == self.wait_at:
                self.gate_opened.append(self.recorder.gate.thread_event.wait(30))
            return result(n, part)

        async def astep(n: int, part: int) -> str:
            """Do step n (async: waits on the loop)."""
            if n == self.wait_at:
                await self.recorder.gate.loop_event.wait()
                self.gate_opened.append(True)
            return result(n, part)

        def noted(n: int, part: int, runtime: ToolRuntime) -> Command:
            """Do step n and add a note (two messages where one was predicted)."""
            return Command(
                update={
                    "messages": [
                        ToolMessage(result(n, part), tool_call_id=runtime.tool_call_id),
                        HumanMessage(f"note {n}"),
                    ]
                }
            )

        def ask(n: int, part: int) -> str:
            """Ask the human (a LangGraph interrupt)."""
            return f"step {n} said {interrupt('go on?')}"

        self.all = [
            StructuredTool.from_function(func=step, coroutine=astep, name="step"),
            StructuredTool.from_function(func=noted, name="noted"),
            StructuredTool.from_function(func=ask, name="ask"),
        ]


def make_agent(model: StepModel, recorder: Recorder, tools: Tools, **summarization: Any) -> Any:
    middleware = SummarizationMiddleware(SummaryModel(recorder=recorder), **summarization)
    return create_agent(model, tools.all, middleware=[middleware, TeolaMiddleware()], checkpointer=InMemorySaver())


def user(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def thread(name: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": name}}


def view(messages: list[BaseMessage]) -> list[Any]:
    """Everything but the ids LangChain makes random."""
    return [
        (type(m).__name__, m.content, [(c["name"], c["args"], c["id"]) for c in getattr(m, "tool_calls", [])])
        for m in messages
    ]


@pytest.fixture
def programs() -> list[Program]:
    return []


def optimize(agent: Any, programs: list[Program], **options: Any) -> OptimizedAgent:
    fast = teola.optimize(agent, on_program=programs.append, **options)
    assert isinstance(fast, OptimizedAgent)
    return fast


# Messages trigger 4, keep 2: from turn 2 on, each turn's summary is known while its tool runs.
AHEAD = {"trigger": ("messages", 4), "keep": ("messages", 2)}


# -- (1), (2): same messages, summaries computed ahead and used -----------------------------------
async def test_ainvoke_summarizes_while_the_tool_waits(programs: list[Program]) -> None:
    recorder = Recorder()
    tools = Tools(recorder)
    agent = make_agent(StepModel(steps=4), recorder, tools, **AHEAD)
    fast = optimize(agent, programs)
    expected = await agent.ainvoke(user("go"), thread("plain"))  # the hooks pass plain runs through
    plain_prompts = recorder.prompts
    assert len(plain_prompts) == 3

    recorder.reset()
    tools.wait_at = 2  # turn 2's tool returns only once a summary has started
    got = await fast.ainvoke(user("go"), thread("teola"))
    assert view(got["messages"]) == view(expected["messages"])
    assert tools.gate_opened == [True]
    assert recorder.prompts == plain_prompts  # the same summaries, each computed once
    stats = programs[-1].stats
    assert (stats.compactions_ahead, stats.compactions_on_path) == (3, 0)


def test_invoke_summarizes_while_the_tool_waits(programs: list[Program]) -> None:
    recorder = Recorder()
    tools = Tools(recorder)
    agent = make_agent(StepModel(steps=3, width=2), recorder, tools, **AHEAD)
    fast = optimize(agent, programs)
    expected = agent.invoke(user("go"), thread("plain"))
    plain_prompts = recorder.prompts
    assert len(plain_prompts) == 3  # two results per turn: from turn 1 on

    recorder.reset()
    tools.wait_at = 1
    got = fast.invoke(user("go"), thread("teola"))
    assert view(got["messages"]) == view(expected["messages"])
    assert tools.gate_opened == [True, True]  # both parallel calls of turn 1 saw the summary start
    assert recorder.prompts == plain_prompts
    stats = programs[-1].stats
    assert (stats.compactions_ahead, stats.compactions_on_path) == (3, 0)
    fast.close()


async def test_astream_updates_are_the_plain_agents(programs: list[Program]) -> None:
    recorder = Recorder()
    agent = make_agent(StepModel(steps=3), recorder, Tools(recorder), **AHEAD)
    fast = optimize(agent, programs)
    expected = [c async for c in agent.astream(user("go"), thread("plain"), stream_mode="updates")]
    got = [c async for c in fast.astream(user("go"), thread("teola"), stream_mode="updates")]

    def nodes(chunks: list[dict[str, Any]]) -> list[Any]:
        return [
            (node, view([m for m in (update or {}).get("messages", []) if isinstance(m, BaseMessage)]))
            for chunk in chunks
            for node, update in chunk.items()
        ]

    assert nodes(got) == nodes(expected)
    assert programs[-1].stats.compactions_ahead == 2


# -- (3): no speculation, or a wrong one: the middleware summarizes itself -------------------------
@pytest.mark.parametrize(
    "summarization",
    [
        {"trigger": ("tokens", 200), "keep": ("messages", 2)},  # fires only once the long results arrive
        {"trigger": ("messages", 4), "keep": ("tokens", 60)},  # the cutoff depends on the results
    ],
    ids=["token-trigger", "token-keep"],
)
async def test_what_depends_on_tool_results_is_summarized_on_the_path(
    summarization: dict[str, Any], programs: list[Program]
) -> None:
    recorder = Recorder()
    agent = make_agent(StepModel(steps=3), recorder, Tools(recorder, pad=300), **summarization)
    fast = optimize(agent, programs)
    expected = await agent.ainvoke(user("go"), thread("plain"))
    plain_prompts = recorder.prompts
    assert plain_prompts

    recorder.reset()
    got = await fast.ainvoke(user("go"), thread("teola"))
    assert view(got["messages"]) == view(expected["messages"])
    assert recorder.prompts == plain_prompts  # nothing was started ahead
    stats = programs[-1].stats
    assert (stats.compactions_ahead, stats.compactions_on_path) == (0, len(plain_prompts))


async def test_a_wrong_prediction_is_cancelled_and_summarized_on_the_path(programs: list[Program]) -> None:
    """Turn 2's tool adds a note: the cutoff moves, the summary started ahead is not used."""
    recorder = Recorder()
    model = StepModel(steps=3, noted_step=2)
    agent = make_agent(model, recorder, Tools(recorder), trigger=("messages", 4), keep=("messages", 3))
    fast = optimize(agent, programs)
    expected = await agent.ainvoke(user("go"), thread("plain"))
    plain_prompts = recorder.prompts
    assert len(plain_prompts) == 2

    recorder.reset(hold_first=True)  # the wrong summary is still running when the agent needs another
    got = await fast.ainvoke(user("go"), thread("teola"))
    assert view(got["messages"]) == view(expected["messages"])
    assert recorder.prompts == plain_prompts and recorder.cancelled == 1
    stats = programs[-1].stats
    assert (stats.compactions_ahead, stats.compactions_on_path) == (1, 1)


def test_sync_wrong_prediction(programs: list[Program]) -> None:
    recorder = Recorder()
    model = StepModel(steps=3, noted_step=2)
    agent = make_agent(model, recorder, Tools(recorder), trigger=("messages", 4), keep=("messages", 3))
    fast = optimize(agent, programs)
    expected = agent.invoke(user("go"), thread("plain"))
    plain_prompts = recorder.prompts
    recorder.reset()
    got = fast.invoke(user("go"), thread("teola"))
    assert view(got["messages"]) == view(expected["messages"])
    wasted = [p for p in recorder.prompts if p not in plain_prompts]
    assert [p for p in recorder.prompts if p in plain_prompts] == plain_prompts and len(wasted) == 1
    stats = programs[-1].stats
    assert (stats.compactions_ahead, stats.compactions_on_path) == (1, 1)
    fast.close()


async def test_without_the_compaction_feature_nothing_is_started_ahead(programs: list[Program]) -> None:
    recorder = Recorder()
    agent = make_agent(StepModel(steps=3), recorder, Tools(recorder), **AHEAD)
    fast = optimize(agent, programs, features=AgentFeatures.none())
    expected = await agent.ainvoke(user("go"), thread("plain"))
    plain_prompts = recorder.prompts
    recorder.reset()
    got = await fast.ainvoke(user("go"), thread("teola"))
    assert view(got["messages"]) == view(expected["messages"])
    assert recorder.prompts == plain_prompts
    assert (programs[-1].stats.compactions_ahead, programs[-1].stats.compactions_on_path) == (0, 2)


# -- (4): a speculation the run never uses ends with the run -------------------------------------
async def test_an_interrupted_run_cancels_its_summary_and_leaves_nothing_running(
    programs: list[Program], caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()
    agent = make_agent(StepModel(steps=3, ask_step=2), recorder, Tools(recorder), **AHEAD)
    fast = optimize(agent, programs)
    expected = [await agent.ainvoke(user("go"), thread("plain"))]
    expected.append(await agent.ainvoke(Command(resume="yes"), thread("plain")))
    plain_prompts = recorder.prompts

    recorder.reset(hold_first=True)  # turn 2's summary, started ahead, is running when the run stops
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        before = asyncio.all_tasks()
        got = [await fast.ainvoke(user("go"), thread("teola"))]
        left = asyncio.all_tasks() - before
        assert left and all(t.cancelling() for t in left)  # nothing left running...
        await asyncio.wait(left)  # ...only cancellations to finish
        assert recorder.cancelled == 1 and recorder.running == 0
        got.append(await fast.ainvoke(Command(resume="yes"), thread("teola")))
        gc.collect()
    assert [view(g["messages"]) for g in got] == [view(e["messages"]) for e in expected]
    assert "__interrupt__" in got[0]
    assert recorder.prompts == plain_prompts  # the cancelled call never answered
    # the resumed run re-runs turn 2's tool: its summary is started ahead again, and used
    assert [(p.stats.compactions_ahead, p.stats.compactions_on_path) for p in programs] == [(0, 0), (2, 0)]
    assert not [r for r in caplog.records if r.name == "asyncio"]


# -- the middleware outside Teola ---------------------------------------------------------------
def test_the_hooks_pass_through_outside_an_optimized_run(programs: list[Program]) -> None:
    recorder = Recorder()
    tools = Tools(recorder)
    hooked = make_agent(StepModel(steps=3), recorder, tools, **AHEAD)
    fresh = make_agent(StepModel(steps=3), recorder, tools, **AHEAD)
    optimize(hooked, programs).close()
    optimize(hooked, programs).close()  # a second optimize does not wrap twice
    assert view(hooked.invoke(user("go"), thread("a"))["messages"]) == view(
        fresh.invoke(user("go"), thread("a"))["messages"]
    )
    assert programs == []


# -- streams of tokens, custom summarizers --------------------------------------------------------
def stream_view(chunks: list[Any]) -> list[Any]:
    return [(type(c).__name__, c.content, meta["langgraph_node"]) for c, meta in chunks]


def test_message_streams_are_the_plain_agents(programs: list[Program]) -> None:
    """The summary computed ahead streams no tokens, as the middleware's own does not."""
    recorder = Recorder()
    agent = make_agent(StepModel(steps=3), recorder, Tools(recorder), **AHEAD)
    fast = optimize(agent, programs)
    expected = list(agent.stream(user("go"), thread("plain"), stream_mode="messages"))
    got = list(fast.stream(user("go"), thread("teola"), stream_mode="messages"))
    assert stream_view(got) == stream_view(expected)
    assert programs[-1].stats.compactions_ahead == 2

    async def astream() -> tuple[list[Any], list[Any]]:
        plain = [c async for c in agent.astream(user("go"), thread("aplain"), stream_mode="messages")]
        teola = [c async for c in fast.astream(user("go"), thread("ateola"), stream_mode="messages")]
        return plain, teola

    expected, got = asyncio.run(astream())
    assert stream_view(got) == stream_view(expected)
    assert programs[-1].stats.compactions_ahead == 2
    fast.close()


def test_a_custom_summarizer_is_summarized_ahead_in_async_runs_only(programs: list[Program]) -> None:
    """Speculation runs the async form; a sync run must use the summarizer's sync form, so it waits."""
    recorder = Recorder()

    def summarize(messages: list[BaseMessage]) -> str:
        text = "|".join(f"{m.type}:{m.content}" for m in messages)
        recorder.prompts.append(text)
        return f"custom {digest(text)}"

    agent = make_agent(StepModel(steps=3), recorder, Tools(recorder), summarizer=summarize, **AHEAD)
    fast = optimize(agent, programs)
    expected = agent.invoke(user("go"), thread("plain"))
    plain_prompts = recorder.prompts
    recorder.reset()
    got = fast.invoke(user("go"), thread("teola"))
    assert view(got["messages"]) == view(expected["messages"]) and recorder.prompts == plain_prompts
    assert (programs[-1].stats.compactions_ahead, programs[-1].stats.compactions_on_path) == (0, 2)

    recorder.reset()
    got = asyncio.run(fast.ainvoke(user("go"), thread("ateola")))
    assert view(got["messages"]) == view(expected["messages"]) and recorder.prompts == plain_prompts
    assert (programs[-1].stats.compactions_ahead, programs[-1].stats.compactions_on_path) == (2, 0)
    fast.close()


def test_a_middleware_with_its_own_summaries_is_left_alone(programs: list[Program]) -> None:
    """A subclass may summarize from more than the messages: no hooks, no speculation."""

    class OwnSummaries(SummarizationMiddleware):
        def _create_summary(self, messages_to_summarize: list[Any]) -> str:
            return f"own {len(messages_to_summarize)}"

        async def _acreate_summary(self, messages_to_summarize: list[Any]) -> str:
            return f"own {len(messages_to_summarize)}"

    recorder = Recorder()
    middleware = OwnSummaries(SummaryModel(recorder=recorder), **AHEAD)
    agent = create_agent(StepModel(steps=3), Tools(recorder).all, middleware=[middleware, TeolaMiddleware()])
    fast = optimize(agent, programs)
    assert fast.summarization is None and "_acreate_summary" not in vars(middleware)
    assert view(fast.invoke(user("go"))["messages"]) == view(agent.invoke(user("go"))["messages"])
    assert (programs[-1].stats.compactions_ahead, programs[-1].stats.compactions_on_path) == (0, 0)
    fast.close()
