"""Run a LlamaIndex agent (`FunctionAgent`, `ReActAgent`) with its calls on Teola's agent runtime.

    fast = teola.optimize(agent, idempotent_tools={"lookup": "v1"})
    handler = fast.run(user_msg="...")          # the same handler: stream_events(), await
    output = await handler                      # the AgentOutput the plain agent returns

Every run is one `Program` (`teola_core.agents`); every model call the agent makes in
`take_step` is a `Program.generate` whose decode runs the agent's own `take_step` in the
calling step's context, and every tool call a `Program.call_tool` (timed; shared across
runs for tools declared idempotent). The agent is not touched: a hooked shallow copy
runs. Details: docs/llamaindex.md ("Agents").
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import itertools
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from llama_index.core.agent.workflow import AgentOutput, BaseWorkflowAgent
from llama_index.core.llms import ChatMessage
from llama_index.core.memory import BaseMemory
from llama_index.core.tools import AsyncBaseTool, ToolOutput
from llama_index.core.workflow import Context, StopEvent

from teola_adapters.server_load import ServerLoadWatch, reported_kv_tokens
from teola_core.agents import AgentDropIn, AgentFeatures, Program
from teola_core.agents.token_rate import TokenRate, openai_usage
from teola_core.engines.opaque_llm import OpaqueModelEngine
from teola_core.engines.protocol import Call, EngineLimits, LoadWatch
from teola_core.engines.retention import KVPool
from teola_core.ir.errors import PrimitiveError
from teola_core.runtime.backends import DEFAULT_BACKEND
from teola_llamaindex.common import unwrap_error
from teola_llamaindex.prefix_warmup import load_watch_for

DEFAULT_MAX_TOKENS = 256
"""Recorded on a model call's decode node when the LLM states no output length (the
agent's own LLM decides the length; the number only informs latency profiles)."""


def is_workflow_agent(obj: object) -> bool:
    """A LlamaIndex workflow agent (`FunctionAgent`, `ReActAgent`, ...): `optimize` gives a `TeolaAgent`."""
    return isinstance(obj, BaseWorkflowAgent)


@dataclass(frozen=True)
class AgentCall:
    """One model call of the agent: its own code, run by the engine in the step's context;
    `prompt_chars`, the characters of the messages it sends (0: not known)."""

    run: Callable[[], Awaitable[Any]]
    context: contextvars.Context
    prompt_chars: int = 0

    async def __call__(self) -> Any:
        # A task of its own so the step's context is current (see the module docstring);
        # cancelling the engine's task cancels this one through the await.
        return await asyncio.get_running_loop().create_task(self.run(), context=self.context)


class AgentModelEngine(OpaqueModelEngine, KVPool):
    """The agent's LLM as an engine: a decode awaits the agent's own call (`AgentCall`).

    load_watch: for an LLM on a vLLM-like server (`prefix_warmup.load_watch_for`), the
    calls in flight follow what the server runs at once, the rest wait here in program
    priority order (the agent runtime's rule). Where that server also reports its KV
    cache's size, the engine is a `KVPool` of that size: the agent runtime admits
    programs by KV working set, a prompt counted at the server's tokens per character
    (learned from the answers' usage where the LLM returns it).
    """

    limits = EngineLimits(concurrency=64, max_batch_items=1)  # a batch is one request to the model

    def __init__(self, name: str, load_watch: LoadWatch | None = None) -> None:
        self.name = name
        self.load_watch = load_watch
        self.rate = TokenRate()

    async def generate(self, call: Call, prompt: Any) -> Any:
        if not isinstance(prompt, AgentCall):
            raise TypeError(f"{self.name} runs agent calls, got {type(prompt).__name__}")
        output = await prompt()
        usage = reported_usage(getattr(output, "raw", None))
        if usage is not None and prompt.prompt_chars:
            self.rate.observe(prompt.prompt_chars, *usage)
        return output

    # -- KVPool ----------------------------------------------------------------------------
    def kv_capacity_tokens(self) -> int | None:
        """The KV cache of the LLM's server, once a reading has said (None before, or elsewhere)."""
        watch = self.load_watch
        return reported_kv_tokens(watch) if isinstance(watch, ServerLoadWatch) else None

    def count_tokens(self, text: Any) -> int | None:
        if not isinstance(text, AgentCall) or not text.prompt_chars:
            return None
        return self.rate.prompt_tokens_of(text.prompt_chars)


def prompt_chars(messages: Sequence[ChatMessage]) -> int:
    """The characters of the messages a model call sends: their text and tool calls."""
    return sum(len(m.content or "") + len(str(m.additional_kwargs.get("tool_calls") or "")) for m in messages)


def reported_usage(raw: Any) -> tuple[int, int] | None:
    """Prompt and answer tokens from an LLM's raw answer (an OpenAI completion or its dict), if it has them."""
    return openai_usage(raw.get("usage") if isinstance(raw, Mapping) else getattr(raw, "usage", None))


class _ToolFailed(Exception):
    """Carries a failed tool's `ToolOutput` through the cache (failures are not kept)."""

    def __init__(self, output: ToolOutput) -> None:
        super().__init__(output.content)
        self.output = output


def _own_copy(output: ToolOutput) -> ToolOutput:
    """A runner's own copy of a shared output (the agents put `blocks` into messages)."""
    return output.model_copy(update={"blocks": list(output.blocks)})


class _TeolaHooks:
    """The two hooks, mixed in before the agent's own class (see the module docstring)."""

    _teola: ClassVar[TeolaAgent]

    async def take_step(
        self, ctx: Context, llm_input: list[ChatMessage], tools: Sequence[AsyncBaseTool], memory: BaseMemory
    ) -> AgentOutput:
        own = super().take_step  # type: ignore[misc]
        return await self._teola._generate(lambda: own(ctx, llm_input, tools, memory), prompt_chars(llm_input))

    async def _generate_early_stopping_response(self, ctx: Context, max_iterations: int) -> StopEvent:
        own = super()._generate_early_stopping_response  # type: ignore[misc]
        return await self._teola._generate(lambda: own(ctx, max_iterations))

    async def _call_tool(self, ctx: Context, tool: AsyncBaseTool, tool_input: dict[str, Any]) -> ToolOutput:
        own = super()._call_tool  # type: ignore[misc]
        return await self._teola._call_tool(tool.metadata.get_name(), tool_input, lambda: own(ctx, tool, tool_input))


def _hooked_copy(agent: BaseWorkflowAgent, wrapper: TeolaAgent) -> BaseWorkflowAgent:
    """A shallow copy of `agent` whose class adds the hooks; `agent` itself is unchanged."""
    cls = type(agent)
    hooked = type(
        f"Teola{cls.__name__}",
        (_TeolaHooks, cls),
        {"__module__": __name__, "__qualname__": f"Teola{cls.__qualname__}", "_teola": wrapper},
    )
    clone = agent.model_copy()
    clone.__class__ = hooked
    return clone


class TeolaAgent(AgentDropIn):
    """`run(...)` of a LlamaIndex agent with its model and tool calls on Teola's agent runtime.

    idempotent_tools: tool name -> version of the tools whose results may be shared
    across runs (same name, arguments and version: same result). features and
    priority_rule: as `AgentRuntime` takes them. backend, ray: where the runs' graphs run
    (the agent's model stays in the driver, where its steps call it). `agent` is the hooked
    copy that runs (its other attributes are this object's); `original` the user's agent,
    untouched.
    """

    forwards_to = "agent"

    def __init__(
        self,
        agent: BaseWorkflowAgent,
        *,
        idempotent_tools: Mapping[str, str] | None = None,
        features: AgentFeatures | None = None,
        priority_rule: Literal["fcfs", "plas"] = "fcfs",
        backend: str = DEFAULT_BACKEND,
        ray: Any = None,
    ) -> None:
        if not isinstance(agent, BaseWorkflowAgent):
            raise TypeError(f"TeolaAgent wraps a LlamaIndex workflow agent, not {type(agent).__name__}")
        idempotent = dict(idempotent_tools or {})
        for name, version in idempotent.items():
            if not isinstance(name, str) or not isinstance(version, str):
                raise TypeError(f"idempotent_tools maps tool names to version strings, got {name!r}: {version!r}")
        super().__init__(agent.name, features, priority_rule)
        self.original = agent
        self.idempotent_tools = idempotent
        self.engine = self.engines.engine_for(
            agent.llm, "llm", lambda name: AgentModelEngine(name, load_watch_for(agent.llm))
        )
        self.place_engines(self.engines, backend=backend, ray=ray)
        num_output = agent.llm.metadata.num_output
        self.max_tokens = num_output if num_output > 0 else DEFAULT_MAX_TOKENS
        self.agent = _hooked_copy(agent, self)
        self._program: contextvars.ContextVar[Program | None] = contextvars.ContextVar(
            "teola_agent_program", default=None
        )
        self._programs: weakref.WeakKeyDictionary[Any, Program] = weakref.WeakKeyDictionary()
        self._runs = itertools.count()

    # -- the call surface ------------------------------------------------------------
    def run(self, *args: Any, **kwargs: Any) -> Any:
        """The agent's `run(...)`: the same handler; this run is one `Program` until it ends."""
        runtime = self.runtime()
        program = runtime.program(f"{self.original.name}/run{next(self._runs)}")
        token = self._program.set(program)  # the run's steps start in (copies of) this context
        try:
            handler = self.agent.run(*args, **kwargs)
        except BaseException:
            program.finish()
            raise
        finally:
            self._program.reset(token)
        self._programs[handler] = program
        _when_done(handler, functools.partial(self._ended, program))
        return handler

    def _ended(self, program: Program) -> None:
        program.finish()
        self.record.add(program)

    def program_of(self, handler: Any) -> Program:
        """The `Program` of the run `handler` belongs to (its steps and stats)."""
        try:
            return self._programs[handler]
        except KeyError:
            raise KeyError(f"{handler!r} was not returned by this TeolaAgent's run()") from None

    # -- the hooks' work ---------------------------------------------------------------
    def _current(self) -> Program:
        program = self._program.get()
        if program is None:
            raise RuntimeError(
                f"agent {self.original.name!r}: its hooked copy ran outside TeolaAgent.run() (no program)"
            )
        return program

    async def _generate(self, run: Callable[[], Awaitable[Any]], chars: int = 0) -> Any:
        call = AgentCall(run, contextvars.copy_context(), chars)
        try:
            return await self._current().generate(call, engine=self.engine, max_tokens=self.max_tokens)
        except PrimitiveError as exc:
            error = unwrap_error(exc, {})
        raise error

    async def _call_tool(
        self, name: str, tool_input: dict[str, Any], run: Callable[[], Awaitable[ToolOutput]]
    ) -> ToolOutput:
        program = self._current()
        version = self.idempotent_tools.get(name)
        if version is None:
            return await program.call_tool(name, tool_input, run)

        async def run_or_raise() -> ToolOutput:
            output = await run()
            if output.is_error:
                raise _ToolFailed(output)
            return output

        try:
            output = await program.call_tool(name, tool_input, run_or_raise, idempotent=True, version=version)
        except _ToolFailed as failed:
            return _own_copy(failed.output)
        return _own_copy(output)


def _when_done(handler: Any, finish: Callable[[], None]) -> None:
    """Call `finish` once the run ends, however it ends (the caller awaits the outcome).

    A handler of the workflows 1.x line (llama-index-core 0.12) is an `asyncio.Future`;
    from 2.x it is an awaitable whose `stop_event_result()` ends with the run.
    """
    if isinstance(handler, asyncio.Future):
        handler.add_done_callback(lambda _: finish())
        return
    watcher = asyncio.ensure_future(handler.stop_event_result())

    def done(task: asyncio.Future[Any]) -> None:
        finish()
        if not task.cancelled():
            task.exception()  # the run's error belongs to whoever awaits the handler

    watcher.add_done_callback(done)
