"""One run of an optimized LangChain agent: its model and tool calls on its `Program`.

Each model call goes through `Program.generate` on the agent's `AgentModelEngine`, which
runs the agent's own call (the middleware `handler`); each tool call goes through
`Program.call_tool`. Tools declared idempotent share results across runs, identical
calls in flight run once; a result handed to a run is a copy with that run's
`tool_call_id` and no message `id` (else LangGraph's `add_messages` would merge it into
an earlier message). Error results (`status="error"`) and raised errors are not cached.
A tool that returns a `Command` cannot be declared idempotent (its state update is not a
result to share).

Summaries off the critical path: LangChain's `SummarizationMiddleware` summarizes in
`before_model`, while the agent waits. The first tool call of each turn predicts the
messages `before_model` will see and, when the middleware will certainly summarize known
messages, starts its own `_acreate_summary` on them (`Program.compact_ahead`) in the tool
call's context (tracing shows it under the tools step) while the tools run. The
middleware's wrapped summary creation then takes that summary only for exactly the same
messages, else computes it now (`Program.compacted`); one the agent does not use is
cancelled. The exact conditions are in `teola_langchain.agents.summarization`.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from langchain.agents.middleware import AgentMiddleware, ModelRequest, SummarizationMiddleware
from langchain_core.messages import AnyMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.prebuilt.tool_node import ToolCallRequest

from teola_core.agents import Program
from teola_core.ir.errors import PrimitiveError
from teola_langchain.agents.caller_turn import CallerTurn, in_context
from teola_langchain.agents.engine import AgentModelCall
from teola_langchain.agents.summarization import SummaryAhead, summary_ahead, summary_key, sync_speculation, tool_turn
from teola_langchain.components.models import DEFAULT_MAX_TOKENS

RUN_KEY = "__teola_agent_run"
"""The `configurable` key carrying the current `AgentRun` to the middleware (LangGraph
neither stores `__` keys in checkpoints nor copies them into metadata)."""

ModelHandler = Callable[[ModelRequest], Any]
ToolHandler = Callable[[ToolCallRequest], Any]


class RunOwner(Protocol):
    """What a run reads from the optimized agent that started it (`OptimizedAgent`)."""

    @property
    def middleware(self) -> AgentMiddleware[Any, Any]: ...

    @property
    def engine_name(self) -> str: ...

    @property
    def idempotent_tools(self) -> dict[str, str]: ...

    @property
    def direct_tools(self) -> frozenset[str]: ...

    @property
    def summarization(self) -> SummarizationMiddleware | None: ...


class _ErrorResult(Exception):
    """An idempotent tool's error `ToolMessage`: raised so the cache does not keep it."""

    def __init__(self, message: ToolMessage) -> None:
        super().__init__(str(message.content))
        self.message = message


@dataclass(eq=False)
class AgentRun:
    """One run of an optimized agent: its program and the loop the program's runtime is on."""

    agent: RunOwner
    program: Program
    loop: asyncio.AbstractEventLoop
    sync: bool = False  # run by the sync methods (the program on the agent's own loop)
    _ahead_turn: str | None = field(default=None, init=False)  # the last turn whose summary was considered
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)  # sync tools: threads

    def config(self, config: RunnableConfig | None) -> RunnableConfig:
        """The caller's config with this run in `configurable`."""
        patched: dict[str, Any] = dict(config or {})
        patched["configurable"] = {**(patched.get("configurable") or {}), RUN_KEY: self}
        return patched  # type: ignore[return-value]

    # -- model calls -------------------------------------------------------------------
    def model_call(self, request: ModelRequest, handler: ModelHandler) -> Any:
        turn = CallerTurn(self.loop)
        return turn.run(self._generate(request, lambda sent: turn.call(lambda: handler(sent))))

    async def amodel_call(self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[Any]]) -> Any:
        self._check_loop()
        context = contextvars.copy_context()
        return await self._generate(request, lambda sent: in_context(context, lambda: handler(sent)))

    async def _generate(self, request: ModelRequest, run: Callable[[ModelRequest], Awaitable[Any]]) -> Any:
        max_tokens = getattr(request.model, "max_tokens", None)  # an estimate for scheduling only
        try:
            return await self.program.generate(
                AgentModelCall(request, run),
                engine=self.agent.engine_name,
                max_tokens=max_tokens if isinstance(max_tokens, int) else DEFAULT_MAX_TOKENS,
            )
        except PrimitiveError as exc:
            error = _unwrap(exc)
        raise error

    # -- tool calls --------------------------------------------------------------------
    def tool_call(self, request: ToolCallRequest, handler: ToolHandler) -> Any:
        ahead = self._summary_ahead(request)
        context = contextvars.copy_context()
        turn = CallerTurn(self.loop)
        return turn.run(self._call_tool(request, lambda: turn.call(lambda: handler(request)), ahead, context))

    async def atool_call(self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[Any]]) -> Any:
        self._check_loop()
        ahead = self._summary_ahead(request)
        return await self._call_tool(request, lambda: handler(request), ahead, contextvars.copy_context())

    async def _call_tool(
        self,
        request: ToolCallRequest,
        run: Callable[[], Awaitable[Any]],
        ahead: SummaryAhead | None,
        context: contextvars.Context,
    ) -> Any:
        if ahead is not None:  # started in the tool call's context (LangChain's config and callbacks)
            context.run(self.program.compact_ahead, ahead.key, ahead.summarize)
        name = request.tool_call["name"]
        version = self.agent.idempotent_tools.get(name)
        if version is None:
            return await self.program.call_tool(name, request.tool_call["args"], run)

        async def cacheable() -> ToolMessage:
            result = await run()
            if not isinstance(result, ToolMessage):
                raise TypeError(
                    f"tool {name!r} returned a {type(result).__name__}, not a ToolMessage: only tools whose "
                    "result is a ToolMessage can be declared idempotent (remove it from idempotent_tools)"
                )
            if result.status == "error":
                raise _ErrorResult(result)
            return result.model_copy()  # the cache's own copy: LangGraph sets ids on what it receives

        try:
            message = await self.program.call_tool(
                name, request.tool_call["args"], cacheable, idempotent=True, version=version
            )
        except _ErrorResult as failed:
            message = failed.message
        return message.model_copy(update={"tool_call_id": request.tool_call["id"], "id": None})

    # -- summaries (SummarizationMiddleware) ---------------------------------------------
    def _summary_ahead(self, request: ToolCallRequest) -> SummaryAhead | None:
        """The summary to start while this turn's tools run: considered once per turn, by its first tool call.

        Sync runs call it in the tool call's thread: token counting stays off the program's loop.
        """
        middleware = self.agent.summarization
        if middleware is None or not self.program.runtime.features.compaction:
            return None
        if self.sync and not sync_speculation(middleware):
            return None
        turn = tool_turn(request)
        if turn is None or turn.id is None:
            return None
        with self._lock:
            if turn.id == self._ahead_turn:
                return None
            self._ahead_turn = turn.id
        return summary_ahead(middleware, turn, self.agent.direct_tools)

    def summary(self, messages: list[AnyMessage], create: Callable[[list[AnyMessage]], str]) -> str:
        """The middleware's `_create_summary` in a sync run: the one computed ahead for exactly
        these messages, else `create` now, in the calling (LangGraph) thread."""
        key = summary_key(messages)
        turn = CallerTurn(self.loop)
        return turn.run(self.program.compacted(key, lambda: turn.call(lambda: create(messages))))

    async def asummary(self, messages: list[AnyMessage], create: Callable[[list[AnyMessage]], Awaitable[str]]) -> str:
        """The middleware's `_acreate_summary`: the one computed ahead for exactly these messages, else now."""
        self._check_loop()
        return await self.program.compacted(summary_key(messages), lambda: create(messages))

    def _check_loop(self) -> None:
        if asyncio.get_running_loop() is not self.loop:
            raise RuntimeError(
                "an async model or tool call of an optimized agent ran on another event loop than its run; "
                "call the agent's sync methods (invoke, stream) or async ones (ainvoke, astream) consistently"
            )


def run_in(config: RunnableConfig | None) -> AgentRun | None:
    """The optimized run a node's config carries (`configurable[RUN_KEY]`), if any."""
    run = ((config or {}).get("configurable") or {}).get(RUN_KEY)
    return run if isinstance(run, AgentRun) else None


def _unwrap(exc: BaseException) -> BaseException:
    """The exception the agent's own call raised, with a note naming Teola's primitive."""
    while isinstance(exc, PrimitiveError):
        inner = exc.error
        inner.add_note(f"teola: raised in primitive {exc.node}")
        exc = inner
    return exc


__all__ = ["RUN_KEY", "AgentRun", "ModelHandler", "RunOwner", "ToolHandler", "run_in"]
