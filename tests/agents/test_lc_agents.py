"""`teola.optimize(agent)` on real LangChain 1.x agents: same messages, calls through Teola.

The model is a deterministic chat model whose answer is a function of the conversation
(so concurrent runs cannot disturb each other), emitting tool calls as a tool-calling
model does; the tools are real LangChain tools. Every test compares the optimized agent
with the plain agent on the same input: message types, contents, tool calls,
`tool_call_id`s and statuses must be equal (message ids are random in LangChain itself).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("langchain.agents")

from langchain.agents import create_agent
from langchain.agents.middleware import ModelRequest, dynamic_prompt
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import ToolRuntime
from langgraph.types import Command, interrupt

import teola
from teola_core.agents import AgentFeatures, Program
from teola_core.ir.kinds import PrimitiveKind
from teola_langchain.agents import OptimizedAgent, TeolaMiddleware


# -- a deterministic tool-calling chat model ------------------------------------------------
def _script(messages: Sequence[BaseMessage]) -> AIMessage:
    """The answer to a conversation.

    The last user message says what to do: "read a b" reads files a and b in parallel
    (one turn), "chain a b" reads them one per turn, "bad" calls read_file with invalid
    arguments, "fail" calls the failing tool, "whoami" the context tool, "ask" the tool
    that interrupts, "flag" the tool that returns a Command. Tool call
    ids derive from the user message, so two questions give different ids. Once the
    tools have answered, the model answers with their results (and the system prompt).
    """
    last = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
    words = str(messages[last].content).split()
    tag = hashlib.sha1(str(messages[last].content).encode()).hexdigest()[:8]
    results = [str(m.content) for m in messages[last + 1 :] if isinstance(m, ToolMessage)]
    system = next((str(m.content) for m in messages if isinstance(m, SystemMessage)), "")

    def call(i: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "args": args, "id": f"{tag}-{i}", "type": "tool_call"}

    command, args = words[0], words[1:]
    if command == "read" and not results:
        return AIMessage("", tool_calls=[call(i, "read_file", {"path": p}) for i, p in enumerate(args)])
    if command == "chain" and len(results) < len(args):
        n = len(results)
        return AIMessage(f"reading {args[n]}", tool_calls=[call(n, "read_file", {"path": args[n]})])
    if command == "bad" and not results:
        return AIMessage("", tool_calls=[call(0, "read_file", {"file": "a"})])
    if command == "fail" and not results:
        return AIMessage("", tool_calls=[call(0, "explode", {"why": "disk on fire"})])
    if command in ("whoami", "ask", "flag") and not results:
        return AIMessage("", tool_calls=[call(0, {"ask": "confirm", "flag": "set_flag"}.get(command, command), {})])
    return AIMessage(f"[{system}] answer: " + " | ".join(results))


class ScriptedChatModel(BaseChatModel):
    """Answers with `_script`; streams word by word; tool calls come with the last chunk."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self.bind(**kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=_script(messages))])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        answer = _script(messages)
        words = str(answer.content).split(" ")
        for i, word in enumerate(words):
            last = i == len(words) - 1
            chunk = AIMessageChunk(
                content=word if last else word + " ",
                tool_call_chunks=[
                    {"name": c["name"], "args": repr(c["args"]).replace("'", '"'), "id": c["id"], "index": j}
                    for j, c in enumerate(answer.tool_calls)
                ]
                if last
                else [],
            )
            if run_manager is not None:
                run_manager.on_llm_new_token(str(chunk.content), chunk=ChatGenerationChunk(message=chunk))
            yield ChatGenerationChunk(message=chunk)


class FailingModel(ScriptedChatModel):
    def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
        raise ConnectionError("the model server went away")

    def _stream(self, *args: Any, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        raise ConnectionError("the model server went away")


# -- real tools -------------------------------------------------------------------------------
class Tools:
    """The agent's tools, counting how often each body ran (thread-safe: sync tools run in threads)."""

    def __init__(self) -> None:
        self.reads: list[str] = []
        self._lock = threading.Lock()

        @tool
        def read_file(path: str) -> str:
            """Read a file."""
            with self._lock:
                self.reads.append(path)
            return f"contents of {path}"

        @tool
        def explode(why: str) -> str:
            """A tool that fails."""
            raise ValueError(why)

        @tool
        def whoami(runtime: ToolRuntime) -> str:
            """The user of this run (from the run's context)."""
            return f"you are {runtime.context.user}"

        @tool
        def confirm() -> str:
            """Ask the human (a LangGraph interrupt)."""
            return f"the human said {interrupt('go ahead?')}"

        @tool
        def set_flag(runtime: ToolRuntime) -> Command:
            """Update the state (a Command, not a ToolMessage)."""
            return Command(update={"messages": [ToolMessage("flag set", tool_call_id=runtime.tool_call_id)]})

        self.all = [read_file, explode, whoami, confirm, set_flag]


@dataclass
class UserContext:
    user: str


@dynamic_prompt
def greet_user(request: ModelRequest) -> str:
    return f"helping {request.runtime.context.user}" if request.runtime.context else "helping nobody"


def make_agent(tools: Tools, *, model: BaseChatModel | None = None, **kwargs: Any) -> Any:
    return create_agent(model or ScriptedChatModel(), tools.all, middleware=[TeolaMiddleware()], **kwargs)


def user(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


# -- comparison ---------------------------------------------------------------------------------
def view(value: Any) -> Any:
    """What must be equal: everything but the ids LangChain makes random."""
    if isinstance(value, BaseMessage):
        return (
            type(value).__name__,
            value.content,
            [(c["name"], c["args"], c["id"]) for c in getattr(value, "tool_calls", [])],
            getattr(value, "tool_call_id", None),
            value.name,
            getattr(value, "status", None),
        )
    if isinstance(value, dict):
        return {k: view(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [view(v) for v in value]
    return value


def messages_view(state: dict[str, Any]) -> list[Any]:
    return view(state["messages"])


def stream_view(chunks: list[Any], mode: str) -> list[Any]:
    if mode == "messages":  # (message chunk, metadata): the chunk and the node it came from
        return [(view(chunk), meta["langgraph_node"]) for chunk, meta in chunks]
    return view(chunks)


@pytest.fixture
def programs() -> list[Program]:
    return []


def optimize(agent: Any, programs: list[Program], **options: Any) -> OptimizedAgent:
    fast = teola.optimize(agent, on_program=programs.append, **options)
    assert isinstance(fast, OptimizedAgent)
    return fast


def assert_through_teola(program: Program, state: dict[str, Any]) -> None:
    """Every model call and tool call of the run went through the program."""
    ai = [m for m in state["messages"] if isinstance(m, AIMessage)]
    tool_messages = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert program.finished
    assert program.stats.model_calls == len(ai) > 0
    assert program.stats.tool_calls == len(tool_messages)
    assert [s.kind for s in program.steps].count("model") == len(ai)
    kinds = [node.kind for node in program.graph().nodes.values()]
    assert kinds.count(PrimitiveKind.DECODE) == len(ai)  # one model call per AI message...
    assert kinds.count(PrimitiveKind.CALL) == len(tool_messages)  # ...and one tool call per ToolMessage


# -- invoke / ainvoke ---------------------------------------------------------------------------
def test_invoke_gives_the_plain_agents_messages(programs: list[Program]) -> None:
    tools = Tools()
    agent = make_agent(tools)
    fast = optimize(agent, programs)
    for question in ("read a.txt b.txt", "chain a.txt b.txt c.txt", "hello"):
        expected = agent.invoke(user(question))
        got = fast.invoke(user(question))
        assert messages_view(got) == messages_view(expected)
        assert_through_teola(programs[-1], got)
    assert len(programs) == 3 and len({p.id for p in programs}) == 3  # one program per run
    assert programs[0].stats.tool_calls == 2  # "read a b": two parallel tool calls in one turn
    explained = fast.explain()
    assert "== runs (3 ended) ==" in explained
    assert f"- tool_calls: {sum(p.stats.tool_calls for p in programs)}" in explained
    assert "== mermaid ==\nflowchart TD" in explained and "recent runs" in explained
    fast.close()


async def test_ainvoke_gives_the_plain_agents_messages(programs: list[Program]) -> None:
    tools = Tools()
    agent = make_agent(tools)
    fast = optimize(agent, programs)
    for question in ("read a.txt b.txt", "chain a.txt b.txt"):
        expected = await agent.ainvoke(user(question))
        got = await fast.ainvoke(user(question))
        assert messages_view(got) == messages_view(expected)
        assert_through_teola(programs[-1], got)


def test_an_agent_without_the_middleware_runs_as_langgraph_runs_it_with_advice() -> None:
    tools = Tools()
    agent = create_agent(ScriptedChatModel(), tools.all)
    fast = teola.optimize(agent)
    assert not isinstance(fast, OptimizedAgent)
    question = user("read a.txt b.txt")
    assert messages_view(fast.invoke(question)) == messages_view(agent.invoke(question))
    assert "create_agent(model, tools, middleware=[..., TeolaMiddleware()])" in fast.explain()
    with pytest.raises(TypeError, match=r"\['idempotent_tools'\] are options of agents built with TeolaMiddleware"):
        teola.optimize(agent, idempotent_tools={"read_file": "v1"})
    with pytest.raises(ValueError, match=r"unknown tool\(s\) \['read_fil'\]"):
        teola.optimize(make_agent(tools), idempotent_tools={"read_fil": "v1"})


def test_the_middleware_alone_passes_calls_through() -> None:
    tools = Tools()
    with_middleware = make_agent(tools)
    without = create_agent(ScriptedChatModel(), tools.all)
    question = user("read a.txt b.txt")
    assert messages_view(with_middleware.invoke(question)) == messages_view(without.invoke(question))


# -- streams ------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["updates", "values", "messages"])
def test_stream_yields_the_plain_agents_chunks(mode: str, programs: list[Program]) -> None:
    tools = Tools()
    agent = make_agent(tools)
    fast = optimize(agent, programs)
    question = user("chain a.txt b.txt")
    expected = list(agent.stream(question, stream_mode=mode))
    got = list(fast.stream(question, stream_mode=mode))
    assert stream_view(got, mode) == stream_view(expected, mode)
    assert len(got) > 3 and programs[-1].stats.model_calls == 3
    if mode == "messages":  # token by token: the model streamed inside Teola's model call
        assert [c.content for c, _ in got[:2]] == ["reading ", "a.txt"]
    fast.close()


@pytest.mark.parametrize("mode", ["updates", "messages"])
async def test_astream_yields_the_plain_agents_chunks(mode: str, programs: list[Program]) -> None:
    tools = Tools()
    agent = make_agent(tools)
    fast = optimize(agent, programs)
    question = user("chain a.txt b.txt")
    expected = [c async for c in agent.astream(question, stream_mode=mode)]
    got = [c async for c in fast.astream(question, stream_mode=mode)]
    assert stream_view(got, mode) == stream_view(expected, mode)
    assert programs[-1].finished and programs[-1].stats.model_calls == 3


async def test_concurrent_astreams_get_their_own_tokens(programs: list[Program]) -> None:
    """Two runs' model calls share Teola's engine; each run's tokens reach its own stream.

    With one model call at a time, the second run's call is started by the engine
    scheduler when the first one ends (in the first run's task): the handler must still
    run with its own run's LangChain context.
    """
    tools = Tools()
    agent = make_agent(tools)
    fast = optimize(agent, programs, model_concurrency=1)
    questions = [user("chain a.txt b.txt"), user("chain c.txt")]

    async def collect(question: dict[str, Any]) -> list[Any]:
        return [c async for c in fast.astream(question, stream_mode="messages")]

    got = await asyncio.gather(*(collect(q) for q in questions))
    for question, chunks in zip(questions, got, strict=True):
        expected = [c async for c in agent.astream(question, stream_mode="messages")]
        assert stream_view(chunks, "messages") == stream_view(expected, "messages")


# -- context and checkpointer ---------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # LangChain's own, plain agent too
def test_context_reaches_the_model_middleware_and_tools(programs: list[Program]) -> None:
    tools = Tools()
    agent = create_agent(
        ScriptedChatModel(), tools.all, middleware=[greet_user, TeolaMiddleware()], context_schema=UserContext
    )
    fast = optimize(agent, programs)
    expected = agent.invoke(user("whoami"), context=UserContext("ada"))
    got = fast.invoke(user("whoami"), context=UserContext("ada"))
    assert messages_view(got) == messages_view(expected)
    assert got["messages"][-1].content == "[helping ada] answer: you are ada"
    fast.close()


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # LangChain's own, plain agent too
async def test_async_context(programs: list[Program]) -> None:
    tools = Tools()
    agent = create_agent(
        ScriptedChatModel(), tools.all, middleware=[greet_user, TeolaMiddleware()], context_schema=UserContext
    )
    fast = optimize(agent, programs)
    expected = await agent.ainvoke(user("whoami"), context=UserContext("bo"))
    got = await fast.ainvoke(user("whoami"), context=UserContext("bo"))
    assert messages_view(got) == messages_view(expected)
    assert got["messages"][-1].content == "[helping bo] answer: you are bo"


def test_checkpointer_threads_carry_the_conversation_across_turns(programs: list[Program]) -> None:
    tools = Tools()
    agent = make_agent(tools, checkpointer=InMemorySaver())
    fast = optimize(agent, programs)
    plain_thread = {"configurable": {"thread_id": "plain"}}
    teola_thread = {"configurable": {"thread_id": "teola"}}
    for question in ("read a.txt", "chain b.txt c.txt"):
        expected = agent.invoke(user(question), plain_thread)
        got = fast.invoke(user(question), teola_thread)
        assert messages_view(got) == messages_view(expected)
    assert len(got["messages"]) == 4 + 6  # both turns' messages are in the thread's state
    assert messages_view(fast.get_state(teola_thread).values) == messages_view(agent.get_state(plain_thread).values)
    assert [p.stats.model_calls for p in programs] == [2, 3]  # one program per turn
    fast.close()


async def test_async_checkpointer_threads(programs: list[Program]) -> None:
    tools = Tools()
    agent = make_agent(tools, checkpointer=InMemorySaver())
    fast = optimize(agent, programs)
    for question in ("read a.txt", "read b.txt d.txt"):
        expected = await agent.ainvoke(user(question), {"configurable": {"thread_id": "plain"}})
        got = await fast.ainvoke(user(question), {"configurable": {"thread_id": "teola"}})
        assert messages_view(got) == messages_view(expected)
    assert len(got["messages"]) == 4 + 5


# -- failures ---------------------------------------------------------------------------------------
def test_a_failing_tool_raises_as_in_langchain(programs: list[Program]) -> None:
    tools = Tools()
    agent = make_agent(tools)
    fast = optimize(agent, programs, idempotent_tools=["explode"])
    with pytest.raises(ValueError, match="disk on fire") as plain_error:
        agent.invoke(user("fail"))
    with pytest.raises(ValueError, match="disk on fire") as teola_error:
        fast.invoke(user("fail"))
    assert type(teola_error.value) is type(plain_error.value)
    assert programs[-1].finished  # the failed run's program ended too
    fast.close()


async def test_invalid_tool_arguments_give_langchains_error_message_uncached(programs: list[Program]) -> None:
    tools = Tools()
    agent = make_agent(tools)
    fast = optimize(agent, programs, idempotent_tools={"read_file": "v1"})
    expected = await agent.ainvoke(user("bad"))
    for _ in range(2):
        got = await fast.ainvoke(user("bad"))
        assert messages_view(got) == messages_view(expected)
        assert got["messages"][2].status == "error"
    assert [p.stats.tool_cache_hits for p in programs] == [0, 0]  # error results are not kept


async def test_a_failing_model_raises_its_own_exception(programs: list[Program]) -> None:
    agent = make_agent(Tools(), model=FailingModel())
    fast = optimize(agent, programs)
    with pytest.raises(ConnectionError, match="went away") as error:
        await fast.ainvoke(user("read a.txt"))
    assert any("teola" in note for note in getattr(error.value, "__notes__", []))
    assert programs[-1].finished


# -- idempotent tools -------------------------------------------------------------------------------
async def test_idempotent_tools_run_once_across_concurrent_runs(programs: list[Program]) -> None:
    tools = Tools()
    agent = make_agent(tools)
    questions = [user("read a.txt b.txt"), user("read a.txt c.txt")]  # a.txt in both, other call ids
    expected = [await agent.ainvoke(q) for q in questions]
    tools.reads.clear()
    fast = optimize(agent, programs, idempotent_tools={"read_file": "v1"})
    got = await asyncio.gather(*(fast.ainvoke(q) for q in questions))
    assert [messages_view(g) for g in got] == [messages_view(e) for e in expected]
    assert sorted(tools.reads) == ["a.txt", "b.txt", "c.txt"]  # a.txt's body ran once
    stats = fast.runtime().tool_cache.stats
    assert (stats.runs, stats.hits + stats.merged) == (3, 1)
    shared = [
        next(m for m in g["messages"] if isinstance(m, ToolMessage) and m.content == "contents of a.txt") for g in got
    ]
    assert shared[0].tool_call_id != shared[1].tool_call_id and shared[0].id != shared[1].id
    again = await fast.ainvoke(questions[0])  # a later run: both from the cache
    assert messages_view(again) == messages_view(expected[0]) and len(tools.reads) == 3
    assert programs[-1].stats.tool_cache_hits == 2


def test_identical_calls_in_one_turn_keep_both_results(programs: list[Program]) -> None:
    """A cached ToolMessage gets the current tool_call_id and no id, so add_messages keeps both."""
    tools = Tools()
    agent = make_agent(tools)
    fast = optimize(agent, programs, idempotent_tools={"read_file": "v1"})
    expected = agent.invoke(user("read a.txt a.txt"))
    tools.reads.clear()
    got = fast.invoke(user("read a.txt a.txt"))
    assert messages_view(got) == messages_view(expected)
    assert [m.tool_call_id for m in got["messages"] if isinstance(m, ToolMessage)] == [
        c["id"] for c in got["messages"][1].tool_calls
    ]
    assert tools.reads == ["a.txt"]
    fast.close()


def test_sync_batch_shares_the_tool_cache(programs: list[Program]) -> None:
    tools = Tools()
    agent = make_agent(tools)
    questions = [user("read a.txt b.txt"), user("read b.txt a.txt"), user("chain a.txt b.txt")]
    expected = agent.batch(questions)
    tools.reads.clear()
    fast = optimize(agent, programs, idempotent_tools={"read_file": "v1"})
    got = fast.batch(questions)
    assert [messages_view(g) for g in got] == [messages_view(e) for e in expected]
    assert sorted(tools.reads) == ["a.txt", "b.txt"]
    (runtime,) = fast.agent_runtimes()  # all sync runs share the agent's own loop
    stats = runtime.tool_cache.stats
    assert (stats.runs, stats.hits + stats.merged) == (2, 4)
    fast.close()


def test_interrupt_and_resume_on_a_thread(programs: list[Program]) -> None:
    tools = Tools()
    agent = make_agent(tools, checkpointer=InMemorySaver())
    fast = optimize(agent, programs)
    plain_thread = {"configurable": {"thread_id": "plain"}}
    teola_thread = {"configurable": {"thread_id": "teola"}}
    expected = agent.invoke(user("ask"), plain_thread)
    got = fast.invoke(user("ask"), teola_thread)
    assert [i.value for i in got["__interrupt__"]] == [i.value for i in expected["__interrupt__"]] == ["go ahead?"]
    expected = agent.invoke(Command(resume="yes"), plain_thread)
    got = fast.invoke(Command(resume="yes"), teola_thread)
    assert messages_view(got) == messages_view(expected)
    assert got["messages"][-1].content == "[] answer: the human said yes"
    assert [p.finished for p in programs] == [True, True]
    fast.close()


def test_a_tool_returning_a_command_cannot_be_idempotent(programs: list[Program]) -> None:
    tools = Tools()
    agent = make_agent(tools)
    assert messages_view(optimize(agent, programs).invoke(user("flag"))) == messages_view(agent.invoke(user("flag")))
    fast = optimize(agent, programs, idempotent_tools=["set_flag"])
    with pytest.raises(TypeError, match="'set_flag' returned a Command, not a ToolMessage"):
        fast.invoke(user("flag"))


async def test_without_the_tool_cache_feature_idempotent_tools_run_every_time(programs: list[Program]) -> None:
    tools = Tools()
    agent = make_agent(tools)
    fast = optimize(agent, programs, idempotent_tools={"read_file": "v1"}, features=AgentFeatures.none())
    expected = await agent.ainvoke(user("read a.txt a.txt"))
    tools.reads.clear()
    got = await fast.ainvoke(user("read a.txt a.txt"))
    assert messages_view(got) == messages_view(expected)
    assert tools.reads == ["a.txt", "a.txt"] and programs[-1].stats.tool_calls == 2
