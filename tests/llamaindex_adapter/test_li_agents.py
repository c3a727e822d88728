"""LlamaIndex agents: `optimize(agent).run(...)` gives what `agent.run(...)` gives.

Each test runs the plain agent and the optimized one on scripted, deterministic models
and tools; the optimized run must give the same response, tool calls and tool outputs
(in order) and stream the same events, while each of its model calls is a prefill +
decode on Teola's agent runtime (seen through a runtime hook and the run's `Program`)
and each tool call a `Program.call_tool`. `FunctionAgent` and `ReActAgent` exist on
both llama-index-core lines (0.12.52 with workflows 1.x, 0.14 with workflows 2.x), and
`optimize` routes them on both, so the suite runs on both; the agents' `streaming` and
`early_stopping_method` options exist only on 0.14.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from drop_in_family import check_drop_in
from llama_index.core.agent.workflow import (
    AgentOutput,
    AgentStream,
    BaseWorkflowAgent,
    FunctionAgent,
    ReActAgent,
    ToolCall,
    ToolCallResult,
)
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.llms import MockLLM
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.tools import BaseTool, FunctionTool
from llama_index.core.workflow import Context

import teola
from teola_core.ir.kinds import PrimitiveKind
from teola_core.runtime.base import PrimitiveSpan
from teola_llamaindex.agents import TeolaAgent

pytestmark = [  # workflows' step discovery reads every attribute of the (pydantic) agent
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20"),
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince211"),
]
HAS_STREAMING_OPTION = "streaming" in BaseWorkflowAgent.model_fields  # 0.14: False = achat
HAS_EARLY_STOPPING = "early_stopping_method" in BaseWorkflowAgent.model_fields
REQUEST: contextvars.ContextVar[str | None] = contextvars.ContextVar("request", default=None)
"""A caller's per-request context (as tracing and instrumentation keep theirs)."""


# -- scripted models and tools -------------------------------------------------------------
class Script:
    """What the model says on each turn (by the tool results seen so far); counts its calls."""

    def __init__(self, plan: Callable[[str], list[tuple[str, dict[str, Any]]]]) -> None:
        self.plan = plan  # user message -> tool calls of the first turn
        self.calls = 0
        self.times: list[float] = []  # when each call happened (the runtime's clock)
        self.requests: list[tuple[str, str | None]] = []  # (user message, caller's REQUEST then)

    def _called(self, user: str) -> None:
        self.calls += 1
        self.times.append(time.monotonic())
        self.requests.append((user, REQUEST.get()))

    def function_calling(self, messages: Sequence[ChatMessage]) -> ChatMessage:
        """A function-calling turn: the planned tool calls first, then the answer from the results."""
        user = next(str(m.content) for m in reversed(messages) if m.role == MessageRole.USER)
        self._called(user)
        results = [m for m in messages if m.role == MessageRole.TOOL]
        if results:
            return ChatMessage(role=MessageRole.ASSISTANT, content="answer: " + " | ".join(m.content for m in results))
        calls = [
            ToolSelection(tool_id=f"call-{i}-{name}", tool_name=name, tool_kwargs=args)
            for i, (name, args) in enumerate(self.plan(user))
        ]
        return ChatMessage(role=MessageRole.ASSISTANT, content="", additional_kwargs={"tool_calls": calls})

    def react(self, prompt: str) -> str:
        """A ReAct text: one action per planned call, then the answer from the observations."""
        conversation = prompt.rsplit("## Current Conversation", 1)[1]  # after the format instructions
        lines = conversation.splitlines()
        observations = [line.split("Observation:", 1)[1].strip() for line in lines if "Observation:" in line]
        user = next(line for line in lines if line.startswith("user: ")).removeprefix("user: ")
        self._called(user)
        plan = self.plan(user)
        if len(observations) < len(plan):
            name, args = plan[len(observations)]
            return f"Thought: I need {name}.\nAction: {name}\nAction Input: {json.dumps(args)}"
        return "Thought: I can answer.\nAnswer: " + " | ".join(observations)


class ScriptedReActLLM(MockLLM):
    """A MockLLM whose text is the ReAct script's, streamed in two deltas."""

    script: Any = None

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=self.script.react(prompt))

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        text = self.script.react(prompt)
        half = len(text) // 2

        def gen() -> CompletionResponseGen:
            yield CompletionResponse(text=text[:half], delta=text[:half])
            yield CompletionResponse(text=text, delta=text[half:])

        return gen()


class ScriptedFunctionLLM(FunctionCallingLLM):
    """A deterministic function-calling model (both lines): the script's turns, streamed whole."""

    script: Any = None
    refuse: bool = False  # every chat fails, for the error test

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(is_function_calling_model=True, is_chat_model=True)

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        messages = list(chat_history or [])
        if user_msg is not None:
            messages.append(ChatMessage(role="user", content=user_msg) if isinstance(user_msg, str) else user_msg)
        return {"messages": messages}

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        return list(response.message.additional_kwargs.get("tool_calls", []))

    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        if self.refuse:
            raise ValueError("model refused")
        message = self.script.function_calling(messages)
        return ChatResponse(message=message, delta=message.content)

    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self.chat(messages)

    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return iter([self.chat(messages)])

    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        response = self.chat(messages)

        async def gen() -> ChatResponseAsyncGen:
            yield response

        return gen()

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        raise NotImplementedError("the agents chat")

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        raise NotImplementedError("the agents chat")

    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        raise NotImplementedError("the agents chat")

    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        raise NotImplementedError("the agents chat")


class Tools:
    """Async tools (deterministic order of completion) that count how often their body ran."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}

    def _ran(self, name: str) -> None:
        self.runs[name] = self.runs.get(name, 0) + 1

    def make(self) -> list[FunctionTool]:
        async def lookup(key: str) -> str:
            """Look a key up."""
            self._ran("lookup")
            return f"value of {key}"

        async def add(a: int, b: int) -> int:
            """Add two numbers."""
            self._ran("add")
            return a + b

        async def broken(x: str) -> str:
            """Always fails."""
            self._ran("broken")
            raise ValueError(f"broken tool refused {x}")

        return [FunctionTool.from_defaults(async_fn=f) for f in (lookup, add, broken)]


def plan(user: str) -> list[tuple[str, dict[str, Any]]]:
    """The first turn's tool calls, read from the user message ("lookup:k add:1,2 broken:x")."""
    calls: list[tuple[str, dict[str, Any]]] = []
    for word in user.split():
        name, _, arg = word.partition(":")
        if name == "lookup":
            calls.append(("lookup", {"key": arg}))
        elif name == "add":
            a, b = arg.split(",")
            calls.append(("add", {"a": int(a), "b": int(b)}))
        elif name == "broken":
            calls.append(("broken", {"x": arg}))
    return calls


def function_agent(script: Script, tools: Tools, **kwargs: Any) -> FunctionAgent:
    llm = ScriptedFunctionLLM()
    llm.script = script
    return FunctionAgent(tools=tools.make(), llm=llm, **kwargs)


def react_agent(script: Script, tools: Tools, **kwargs: Any) -> ReActAgent:
    llm = ScriptedReActLLM()
    llm.script = script
    return ReActAgent(tools=tools.make(), llm=llm, **kwargs)


class Spans:
    def __init__(self) -> None:
        self.spans: list[PrimitiveSpan] = []

    def on_span(self, span: PrimitiveSpan) -> None:
        self.spans.append(span)

    def decodes(self, program_id: str | None = None) -> list[PrimitiveSpan]:
        return [
            s
            for s in self.spans
            if s.node.kind is PrimitiveKind.DECODE and (program_id is None or s.query_id.startswith(program_id + "/"))
        ]


def optimized(agent: BaseWorkflowAgent, **options: Any) -> tuple[TeolaAgent, Spans]:
    fast = teola.optimize(agent, **options)
    assert isinstance(fast, TeolaAgent)
    spans = Spans()
    fast.add_hook(spans)
    return fast, spans


def summary(output: AgentOutput, *, ids: bool) -> tuple[Any, ...]:
    """What must match: the response, and each tool call with its output, in order."""
    calls = [
        (t.tool_id if ids else "", t.tool_name, t.tool_kwargs, t.tool_output.content, t.tool_output.is_error)
        for t in output.tool_calls
        if isinstance(t, ToolCallResult)
    ]
    assert len(calls) == len(output.tool_calls)
    return str(output.response.content), calls


async def run_with_events(agent: Any, message: str) -> tuple[AgentOutput, list[tuple[Any, ...]]]:
    """The run's output and its streamed events (type and the fields that must match)."""
    handler = agent.run(user_msg=message)
    events: list[tuple[Any, ...]] = []
    async for ev in handler.stream_events():
        if isinstance(ev, AgentStream):
            events.append(("stream", ev.delta))
        elif isinstance(ev, ToolCallResult):
            events.append(("result", ev.tool_name, ev.tool_output.content))
        elif isinstance(ev, ToolCall):
            events.append(("call", ev.tool_name, ev.tool_kwargs))
        else:
            events.append((type(ev).__name__,))
    return await handler, events


# -- FunctionAgent ---------------------------------------------------------------------------
def test_function_agent_same_output_every_call_on_teola() -> None:
    script, tools = Script(plan), Tools()
    agent = function_agent(script, tools)
    fast, spans = optimized(agent)
    message = "lookup:alpha"

    async def main() -> tuple[Any, ...]:
        plain = await agent.run(user_msg=message)
        plain_calls = script.calls
        handler = fast.run(user_msg=message)
        got = await handler
        return plain, plain_calls, got, fast.program_of(handler)

    plain, plain_calls, got, program = asyncio.run(main())
    assert summary(got, ids=True) == summary(plain, ids=True)
    assert summary(got, ids=True) == (
        "answer: value of alpha",
        [("call-0-lookup", "lookup", {"key": "alpha"}, "value of alpha", False)],
    )
    assert plain_calls == 2 and script.calls == 4  # the optimized run called the model as often
    assert program.stats.model_calls == 2 and len(spans.decodes(program.id)) == 2
    assert program.stats.tool_calls == 1 and [s.kind for s in program.steps] == ["model", "tool", "model"]
    assert program.finished
    assert {s.node.kind for s in spans.spans} == {PrimitiveKind.PREFILL, PrimitiveKind.DECODE}
    assert {s.node.engine for s in spans.spans} == {fast.engine}
    decodes = spans.decodes(program.id)
    for t in script.times[plain_calls:]:  # each model call ran inside a decode on Teola's engine
        assert any(d.started_at <= t <= d.ended_at for d in decodes), (t, decodes)
    assert type(agent) is FunctionAgent and fast.original is agent and fast.agent is not agent  # untouched
    assert tools.runs == {"lookup": 2}
    explained = fast.explain()
    assert "== runs (1 ended) ==" in explained and "- model_calls: 2" in explained
    assert "== mermaid ==\nflowchart TD" in explained and "1 queries" in explained


def test_conversation_through_ctx_and_memory() -> None:
    """Two turns sharing the caller's `Context` and memory: same answers, one program per run."""
    script, tools = Script(plan), Tools()
    agent = function_agent(script, tools)
    fast, _ = optimized(agent)

    async def conversation(runner: Any) -> tuple[list[Any], list[str], Any]:
        ctx, memory = Context(agent), ChatMemoryBuffer.from_defaults()
        handlers = [runner.run(user_msg="lookup:x", ctx=ctx, memory=memory)]
        outputs = [await handlers[0]]
        handlers.append(runner.run(user_msg="add:1,2", ctx=ctx))
        outputs.append(await handlers[1])
        return outputs, [str(m.content) for m in memory.get_all()], handlers

    plain_calls: list[int] = []

    async def main() -> tuple[Any, ...]:
        plain = await conversation(agent)
        plain_calls.append(script.calls)
        got = await conversation(fast)
        programs = [fast.program_of(h) for h in got[2]]
        runtime = fast.runtime()
        await fast.aclose()
        return plain, got, programs, runtime, fast.runtime()

    (plain, plain_memory, _), (got, got_memory, _), programs, runtime, fresh = asyncio.run(main())
    assert [summary(o, ids=True) for o in got] == [summary(o, ids=True) for o in plain]
    assert got_memory == plain_memory and len(got_memory) >= 4  # both turns are in the caller's memory
    assert sum(p.stats.model_calls for p in programs) == script.calls - plain_calls[0] == plain_calls[0]
    assert all(p.stats.model_calls >= 1 and p.finished for p in programs) and programs[0].id != programs[1].id
    assert fresh is not runtime  # aclose() ended the loop's runtime


def test_function_agent_multi_tool_turn_and_failing_tool() -> None:
    script, tools = Script(plan), Tools()
    agent = function_agent(script, tools)
    fast, _ = optimized(agent)
    message = "lookup:alpha add:2,3 broken:zeta lookup:beta"

    async def main() -> tuple[Any, Any, Any]:
        plain = await agent.run(user_msg=message)
        handler = fast.run(user_msg=message)
        return plain, await handler, fast.program_of(handler)

    plain, got, program = asyncio.run(main())
    assert summary(got, ids=True) == summary(plain, ids=True)
    _, calls = summary(got, ids=True)
    assert [c[1] for c in calls] == ["lookup", "add", "broken", "lookup"]
    assert calls[1][3] == "5" and calls[2][3] == "broken tool refused zeta" and calls[2][4] is True
    assert got.response.content == "answer: value of alpha | 5 | broken tool refused zeta | value of beta"
    assert program.stats.tool_calls == 4 and program.stats.model_calls == 2
    assert tools.runs == {"lookup": 4, "add": 2, "broken": 2}


def test_streaming_events_are_the_same() -> None:
    script, tools = Script(plan), Tools()
    agent = function_agent(script, tools)
    fast, spans = optimized(agent)
    message = "lookup:alpha add:1,1"

    async def main() -> tuple[Any, Any]:
        return await run_with_events(agent, message), await run_with_events(fast, message)

    (plain, plain_events), (got, got_events) = asyncio.run(main())
    assert got_events == plain_events
    assert ("call", "add", {"a": 1, "b": 1}) in got_events and ("result", "add", "2") in got_events
    assert [e for e in got_events if e[0] == "stream"]  # written by the model call run on Teola
    assert got_events[-1] == ("StopEvent",)
    assert summary(got, ids=True) == summary(plain, ids=True)
    assert len(spans.decodes()) == 2


def test_concurrent_runs_stream_their_own_events() -> None:
    """Model calls of concurrent runs meet in one engine; each writes to its own run's stream."""
    script, tools = Script(plan), Tools()
    agent = function_agent(script, tools)
    fast, spans = optimized(agent)
    messages = ["lookup:alpha", "add:2,2", "lookup:gamma add:1,1", "broken:q"]

    async def in_request(message: str) -> Any:
        REQUEST.set(f"request for {message}")
        return await run_with_events(fast, message)

    async def main() -> tuple[list[Any], list[Any]]:
        plain = [await run_with_events(agent, m) for m in messages]
        return plain, list(await asyncio.gather(*(in_request(m) for m in messages)))

    plain, got = asyncio.run(main())
    optimized_calls = script.requests[len(script.requests) // 2 :]
    assert [r for _, r in optimized_calls] == [f"request for {m}" for m, _ in optimized_calls]  # the caller's context
    assert [events for _, events in got] == [events for _, events in plain]
    assert [summary(o, ids=True) for o, _ in got] == [summary(o, ids=True) for o, _ in plain]
    assert len(spans.decodes()) == 2 * len(messages)


def test_concurrent_runs_share_an_idempotent_tool() -> None:
    script, tools = Script(plan), Tools()
    agent = function_agent(script, tools)
    fast, _ = optimized(agent, idempotent_tools={"lookup": "v1"})
    message = "lookup:alpha add:1,2"

    async def main() -> tuple[Any, list[Any], list[Any], Any]:
        plain = await agent.run(user_msg=message)
        handlers = [fast.run(user_msg=message) for _ in range(2)]
        outputs = list(await asyncio.gather(*handlers))
        return plain, outputs, [fast.program_of(h) for h in handlers], fast.runtime().tool_cache.stats

    plain, outputs, programs, cache = asyncio.run(main())
    assert tools.runs == {"lookup": 2, "add": 3}  # plain once each; optimized: lookup once, add twice
    assert [summary(o, ids=True) for o in outputs] == [summary(plain, ids=True)] * 2
    assert cache.runs == 1 and cache.hits + cache.merged == 1
    assert sorted(p.stats.tool_cache_hits for p in programs) == [0, 1]
    assert len({p.id for p in programs}) == 2 and all(p.finished for p in programs)
    first, second = (o.tool_calls[0].tool_output for o in outputs)
    assert first == second and first is not second  # each run has its own copy


def test_idempotent_tool_failures_are_not_kept() -> None:
    script, tools = Script(plan), Tools()
    fast, _ = optimized(function_agent(script, tools), idempotent_tools={"broken": "v1"})

    async def main() -> list[Any]:
        return [await fast.run(user_msg="broken:x") for _ in range(2)]

    outputs = asyncio.run(main())
    assert [summary(o, ids=True)[1][0][3:] for o in outputs] == [("broken tool refused x", True)] * 2
    assert tools.runs == {"broken": 2}  # the second run ran the tool again


@pytest.mark.skipif(not HAS_EARLY_STOPPING, reason="early_stopping_method is a 0.14 option")
def test_early_stopping_generate_goes_through_teola() -> None:
    script, tools = Script(plan), Tools()
    agent = function_agent(script, tools, early_stopping_method="generate")
    fast, spans = optimized(agent)

    async def main() -> tuple[Any, Any, Any]:
        plain = await agent.run(user_msg="lookup:alpha", max_iterations=1)
        handler = fast.run(user_msg="lookup:alpha", max_iterations=1)
        return plain, await handler, fast.program_of(handler)

    plain, got, program = asyncio.run(main())
    assert summary(got, ids=True) == summary(plain, ids=True)
    assert program.stats.model_calls == 2 == len(spans.decodes(program.id))  # the step's, the final one


def test_model_error_reaches_the_caller() -> None:
    agent = function_agent(Script(plan), Tools())
    agent.llm.refuse = True
    fast, _ = optimized(agent)

    async def run(a: Any) -> BaseException:
        with pytest.raises(Exception, match="model refused") as info:  # 0.12 wraps it per step
            await a.run(user_msg="hi")
        return info.value

    plain, got = asyncio.run(run(agent)), asyncio.run(run(fast))
    assert type(got) is type(plain) and str(got) == str(plain)


def test_the_copy_refuses_to_run_outside_the_wrapper() -> None:
    fast, _ = optimized(function_agent(Script(plan), Tools()))

    async def main() -> None:
        await fast.agent.run(user_msg="lookup:a")

    with pytest.raises(Exception, match=r"outside TeolaAgent\.run"):  # 0.12 wraps it per step
        asyncio.run(main())


def test_bad_options_are_named() -> None:
    agent = function_agent(Script(plan), Tools())
    with pytest.raises(TypeError, match="version strings"):
        teola.optimize(agent, idempotent_tools={"lookup": 1})
    with pytest.raises(ValueError, match="priority rule"):
        teola.optimize(agent, priority_rule="lifo")


# -- ReActAgent ------------------------------------------------------------------------------
@pytest.mark.parametrize("streaming", [True, False] if HAS_STREAMING_OPTION else [True])
def test_react_agent_same_output(streaming: bool) -> None:
    script, tools = Script(plan), Tools()
    options = {"streaming": streaming} if HAS_STREAMING_OPTION else {}
    agent = react_agent(script, tools, **options)
    fast, spans = optimized(agent, idempotent_tools={"lookup": "v1"})
    message = "lookup:alpha broken:b add:4,5"

    async def main() -> tuple[Any, ...]:
        plain, plain_events = await run_with_events(agent, message)
        plain_calls = script.calls
        handler_events = await run_with_events(fast, message)
        return plain, plain_events, plain_calls, *handler_events

    plain, plain_events, plain_calls, got, got_events = asyncio.run(main())
    assert summary(got, ids=False) == summary(plain, ids=False)
    assert summary(got, ids=False) == (
        "value of alpha | broken tool refused b | 9",
        [
            ("", "lookup", {"key": "alpha"}, "value of alpha", False),
            ("", "broken", {"x": "b"}, "broken tool refused b", True),
            ("", "add", {"a": 4, "b": 5}, "9", False),
        ],
    )
    assert got_events == plain_events
    assert bool([e for e in got_events if e[0] == "stream"]) is streaming
    assert plain_calls == 4 and script.calls == 8
    assert len(spans.decodes()) == 4
    assert tools.runs == {"lookup": 2, "broken": 2, "add": 2}


def test_an_agent_is_on_the_drop_in_kit() -> None:
    """The agent row of the drop-in family (`tests/drop_in_family.py`)."""
    agent = function_agent(Script(plan), Tools())
    fast = teola.optimize(agent)

    async def run(app: Any) -> tuple[Any, ...]:
        return summary(await app.run(user_msg="lookup:alpha"), ids=True)

    asyncio.run(check_drop_in(agent, fast, run))
