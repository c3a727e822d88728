"""`optimize(agent)`: a LangChain 1.x agent whose model and tool calls run on Teola's agent runtime.

    from langchain.agents import create_agent
    from teola import optimize
    from teola_langchain.agents import TeolaMiddleware

    agent = create_agent(model, tools, middleware=[..., TeolaMiddleware()])   # Teola's last
    fast = optimize(agent, idempotent_tools={"read_file": "v1"})
    fast.invoke({"messages": [("user", "...")]}, {"configurable": {"thread_id": "t1"}}, context=ctx)

Why a middleware: `create_agent` returns a compiled LangGraph graph whose model node and
tool node close over the model, the tools and the middleware stack; nothing public
(`CompiledStateGraph.builder` holds the same closures) lets Teola rebuild or re-wire an
already compiled agent reliably. So the agent carries `TeolaMiddleware`, LangChain's own
hook (`wrap_model_call` / `wrap_tool_call` and their async twins), and `optimize(agent)`
finds it there; an agent without it runs as any compiled graph does under
`teola.optimize` (`teola_langchain.langgraph`), and its `explain()` says what to add.
Listed last, it is the innermost wrapper: every real model call (retries of outer
middleware included) is one Teola model call, and the tool cache keeps raw tool results.

What a call of the optimized agent does: it starts one `Program` (one agent run) on the
`AgentRuntime` of the event loop it runs on, passes the run to the middleware in the
run's config (`configurable["__teola_agent_run"]`: LangGraph neither stores `__` keys in
checkpoints nor copies them into metadata), runs the agent as LangChain runs it, and
finishes the program. The middleware sends each model call through `Program.generate` on
one engine per optimized agent (`AgentModelEngine`), which runs the agent's own model
call (the middleware `handler`); each tool call goes through `Program.call_tool`. Tools
declared idempotent share results across runs, identical calls in flight run once; a
result handed to a run is a copy with that run's `tool_call_id` and no message `id` (else
LangGraph's `add_messages` would merge it into an earlier message). Error results
(`status="error"`) and raised errors are not cached. A tool that returns a `Command` cannot
be declared idempotent (its state update is not a result to share).

Where calls run: the handler always runs in the caller's own context. Async methods run
the program on the caller's loop and the handler as a task in a copy of the caller's
context (LangChain's config and callbacks, so `stream_mode="messages"` sees the tokens).
Sync methods run the program on a loop the optimized agent owns in a daemon thread; the
handler is handed back to the LangGraph thread that asked for the call, which blocks
until the program says it is its turn — no extra threads, and LangChain runs the sync
model and tools exactly as it would. One `AgentRuntime` per event loop (its runtime and
tool cache hold loop-bound futures): runs share the tool cache and the engine's
scheduler with the runs on the same loop (all sync calls share one). The agent's model
is opaque to Teola (a framework object, no `KVRetention`), so KV holds do not apply to
it; priority applies once `model_concurrency` calls are running.

Summaries off the critical path: LangChain's `SummarizationMiddleware` summarizes in
`before_model`, while the agent waits. When the agent has one, the first tool call of
each turn predicts the messages `before_model` will see (the state's messages plus one
`ToolMessage` per tool call) and, if the middleware will certainly summarize and which
messages it will summarize is already known, starts the middleware's own `_acreate_summary`
on them (`Program.compact_ahead`) while the tools run. `optimize` wraps that middleware
instance's `_create_summary` / `_acreate_summary`: inside an optimized run they take the
summary computed ahead only for exactly the same messages (ids and contents), else
compute it as LangChain does (`Program.compacted`); outside one they are the middleware's
own. The exact conditions are in `teola_langchain.summarization`. A summary started ahead
runs in the tool call's context, so tracing shows it under the tools step; one the agent
does not use is cancelled (another summary is needed, or the run ends).

An agent built with `TeolaMiddleware` but invoked directly (not through `optimize`) runs
as plain LangChain: the middleware passes every call through. The middleware also adds
an empty `before_agent` step, by which `optimize` finds it: streams of `updates` show it
as `{"TeolaMiddleware.before_agent": None}`, as for any middleware with that hook.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from langchain.agents.middleware import AgentMiddleware, ModelRequest, SummarizationMiddleware
from langchain_core.messages import AnyMessage, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import var_child_runnable_config
from langchain_core.tools import BaseTool
from langgraph.config import get_config
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest

from teola_core.agents import AgentFeatures, AgentRuntime, Program
from teola_core.agents.explain import AgentRecord, agent_sections
from teola_core.engines.opaque_llm import OpaqueModelEngine
from teola_core.engines.protocol import Call, EngineLimits, EngineSet
from teola_core.ir.errors import PrimitiveError
from teola_core.runtime.loop_thread import LoopThread
from teola_core.runtime.per_loop import PerLoop
from teola_core.runtime.timeline import RecentSpans
from teola_langchain.models import DEFAULT_MAX_TOKENS
from teola_langchain.summarization import (
    SummaryAhead,
    find_summarization,
    install_hooks,
    summary_ahead,
    summary_key,
    sync_speculation,
    tool_turn,
)

T = TypeVar("T")

RUN_KEY = "__teola_agent_run"
"""The `configurable` key carrying the current `AgentRun` to the middleware."""

ModelHandler = Callable[[ModelRequest], Any]
ToolHandler = Callable[[ToolCallRequest], Any]


class TeolaMiddleware(AgentMiddleware[Any, Any]):
    """Routes the agent's model and tool calls through Teola when run by `optimize(agent)`.

    Add it to `create_agent(..., middleware=[..., TeolaMiddleware()])`, preferably last
    (innermost). Outside an optimized run it passes every call through unchanged.
    """

    def before_agent(self, state: Any, runtime: Any) -> None:
        """Nothing: the step only lets `optimize(agent)` find this middleware in the graph."""
        return None

    async def abefore_agent(self, state: Any, runtime: Any) -> None:
        return None

    def wrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> Any:
        run = self._run(get_config())
        return handler(request) if run is None else run.model_call(request, handler)

    async def awrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[Any]]) -> Any:
        run = self._run(get_config())
        return await handler(request) if run is None else await run.amodel_call(request, handler)

    def wrap_tool_call(self, request: ToolCallRequest, handler: ToolHandler) -> Any:
        run = self._run(request.runtime.config)
        return handler(request) if run is None else run.tool_call(request, handler)

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[Any]]
    ) -> Any:
        run = self._run(request.runtime.config)
        return await handler(request) if run is None else await run.atool_call(request, handler)

    def _run(self, config: RunnableConfig | None) -> AgentRun | None:
        """This run's Teola state, if an optimized agent built with this middleware runs it."""
        run = ((config or {}).get("configurable") or {}).get(RUN_KEY)
        return run if isinstance(run, AgentRun) and run.agent.middleware is self else None


@dataclass(frozen=True)
class AgentModelCall:
    """A model call as the engine sees it: `run()` performs the agent's own call."""

    request: ModelRequest
    run: Callable[[], Awaitable[Any]]


class AgentModelEngine(OpaqueModelEngine):
    """Runs an agent's model calls: decode awaits the call's `run()` (the middleware handler).

    One call per batch: each call is the agent's own model invocation, which has no
    batch API (as `LangChainLLMEngine`); `concurrency` bounds the calls running at once,
    beyond which the scheduler picks by program priority.
    """

    def __init__(self, name: str, concurrency: int) -> None:
        if concurrency < 1:
            raise ValueError(f"model_concurrency must be at least 1 (got {concurrency})")
        self.name = name
        self.limits = EngineLimits(concurrency=concurrency, max_batch_items=1)

    async def generate(self, call: Call, prompt: Any) -> Any:
        if not isinstance(prompt, AgentModelCall):
            raise TypeError(f"{self.name} runs agent model calls, not {type(prompt).__name__}")
        return await prompt.run()


class _ErrorResult(Exception):
    """An idempotent tool's error `ToolMessage`: raised so the cache does not keep it."""

    def __init__(self, message: ToolMessage) -> None:
        super().__init__(str(message.content))
        self.message = message


@dataclass(eq=False)
class AgentRun:
    """One run of an optimized agent: its program and the loop the program's runtime is on."""

    agent: OptimizedAgent
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
        turn = _CallerTurn(self.loop)
        return turn.run(self._generate(request, lambda: turn.call(lambda: handler(request))))

    async def amodel_call(self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[Any]]) -> Any:
        self._check_loop()
        context = contextvars.copy_context()
        return await self._generate(request, lambda: _in_context(context, lambda: handler(request)))

    async def _generate(self, request: ModelRequest, run: Callable[[], Awaitable[Any]]) -> Any:
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
        turn = _CallerTurn(self.loop)
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
        turn = _CallerTurn(self.loop)
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


class OptimizedAgent(Runnable[Any, Any]):
    """A LangChain agent whose model and tool calls run on Teola (see the module docstring).

    Options:
        idempotent_tools: tools whose result depends only on their arguments, by name
            with a version (`{"read_file": "v1"}`: a new version drops old results), or
            an iterable of names (version ""). Their results are shared across runs.
        features: which agent-runtime optimizations apply (`AgentFeatures`, all by default).
        priority_rule: "fcfs" (program start) or "plas" (least model time first).
        model_concurrency: model calls running at once; beyond it calls wait in
            program-priority order (default 64).
        on_program: called with each run's `Program` when the run ends (stats, steps).
    """

    def __init__(
        self,
        agent: Any,
        *,
        idempotent_tools: Mapping[str, str] | Iterable[str] | None = None,
        features: AgentFeatures | None = None,
        priority_rule: Literal["fcfs", "plas"] = "fcfs",
        model_concurrency: int = 64,
        on_program: Callable[[Program], None] | None = None,
    ) -> None:
        if priority_rule not in ("fcfs", "plas"):
            raise ValueError(f"unknown priority rule {priority_rule!r} (known: fcfs, plas)")
        self.agent = agent
        self.name = agent.get_name()
        self.middleware = find_middleware(agent)
        self.idempotent_tools = _tool_versions(idempotent_tools, tool_names(agent))
        self.direct_tools = frozenset(name for name, t in agent_tools(agent).items() if t.return_direct)
        self.summarization = find_summarization(agent)
        if self.summarization is not None:
            install_hooks(self.summarization, _summary_run)
        self.features = features or AgentFeatures()
        self.priority_rule = priority_rule
        self.on_program = on_program
        self.engine_name = f"llm:{self.name}"
        self.engines = EngineSet().add(AgentModelEngine(self.engine_name, model_concurrency))
        self._runtimes: PerLoop[AgentRuntime] = PerLoop()
        self.record = AgentRecord()
        self.recent = RecentSpans()
        recent = self.recent  # not self: the setup is kept by the PerLoop, which self holds
        self._runtimes.apply_to_all(lambda runtime: runtime.runtime.add_hook(recent))
        self._thread = LoopThread(f"teola-agent:{self.name}")
        self._sync_loop: asyncio.AbstractEventLoop | None = None
        self._finalizer = weakref.finalize(self, self._thread.close)

    # -- structure ---------------------------------------------------------------------
    @property
    def InputType(self) -> Any:
        return self.agent.InputType

    @property
    def OutputType(self) -> Any:
        return self.agent.OutputType

    def get_input_schema(self, config: RunnableConfig | None = None) -> Any:
        return self.agent.get_input_schema(config)

    def get_output_schema(self, config: RunnableConfig | None = None) -> Any:
        return self.agent.get_output_schema(config)

    @property
    def config_specs(self) -> Any:
        return self.agent.config_specs

    def get_graph(self, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return self.agent.get_graph(config, **kwargs)

    def __getattr__(self, name: str) -> Any:
        """The agent's other API (`get_state`, `update_state`, `checkpointer`, ...) as is."""
        if name.startswith("_") or name == "agent":
            raise AttributeError(name)
        return getattr(self.agent, name)

    def runtime_for_current_loop(self) -> AgentRuntime:
        """The agent runtime serving runs on the running event loop (made on first use)."""
        return self._runtimes.current(self._new_runtime)

    def _new_runtime(self) -> AgentRuntime:
        return AgentRuntime(self.engines, features=self.features, priority_rule=self.priority_rule)

    def agent_runtimes(self) -> list[AgentRuntime]:
        """The agent runtimes of the loops this agent has run on (its own sync loop included)."""
        return self._runtimes.values()

    def close(self) -> None:
        """Close the sync methods' agent runtime and stop their loop thread (both restart if used again)."""
        if self._sync_loop is not None:
            self._thread.run(self._aclose_here())
            self._sync_loop = None
        self._thread.close()

    async def _aclose_here(self) -> None:
        runtime = self._runtimes.pop_current()
        if runtime is not None:
            await runtime.close()

    def explain(self, png_dir: str | Path | None = None) -> str:
        """What the agent runtime does, the runs so far, the last run's graph (Mermaid; PNG
        with `png_dir`) and what recent runs did per engine (timeline PNG with `png_dir`)."""
        sections = agent_sections(
            self.name, self.features, self.priority_rule, self.engines, self.record, self.recent.spans(), png_dir
        )
        return "\n".join(sections)

    # -- runs --------------------------------------------------------------------------
    def _open(self, *, sync: bool = False) -> AgentRun:
        """Start a run on the running loop."""
        return AgentRun(self, self.runtime_for_current_loop().program(), asyncio.get_running_loop(), sync=sync)

    def _finish(self, run: AgentRun) -> None:
        run.program.finish()
        self._ended(run.program)

    def _ended(self, program: Program) -> None:
        self.record.add(program)
        if self.on_program is not None:
            self.on_program(program)

    async def _aopen(self) -> AgentRun:
        return self._open(sync=True)

    async def _aend(self, run: AgentRun) -> None:
        run.program.finish()

    @contextmanager
    def _sync_run(self) -> Iterator[AgentRun]:
        """A run whose program lives on the agent's own loop (the caller's thread waits)."""
        run = self._thread.run(self._aopen())
        self._sync_loop = run.loop
        try:
            yield run
        finally:
            self._thread.run(self._aend(run))
            self._ended(run.program)

    # -- call surface ------------------------------------------------------------------
    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        with self._sync_run() as run:
            return self.agent.invoke(input, run.config(config), **kwargs)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        run = self._open()
        try:
            return await self.agent.ainvoke(input, run.config(config), **kwargs)
        finally:
            self._finish(run)

    def stream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[Any]:
        with self._sync_run() as run:
            yield from self.agent.stream(input, run.config(config), **kwargs)

    async def astream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> AsyncIterator[Any]:
        run = self._open()
        try:
            async for chunk in self.agent.astream(input, run.config(config), **kwargs):
                yield chunk
        finally:
            self._finish(run)


def optimize_agent(agent: Any, **options: Any) -> OptimizedAgent:
    """`teola.optimize` for LangGraph graphs: a LangChain agent built with `TeolaMiddleware`."""
    return OptimizedAgent(agent, **options)


def teola_middlewares(graph: Any) -> list[TeolaMiddleware]:
    """The `TeolaMiddleware` instances of a compiled graph, found by their `before_agent` steps
    (none for a graph that is not a `StateGraph` agent)."""
    nodes = getattr(getattr(graph, "builder", None), "nodes", None)
    found: list[TeolaMiddleware] = []
    for spec in nodes.values() if isinstance(nodes, Mapping) else ():
        for func in (getattr(spec.runnable, "func", None), getattr(spec.runnable, "afunc", None)):
            owner = getattr(func, "__self__", None)
            if isinstance(owner, TeolaMiddleware) and owner not in found:
                found.append(owner)
    return found


def find_middleware(agent: Any) -> TeolaMiddleware:
    """The agent's `TeolaMiddleware`, found by its `before_agent` step in the graph."""
    if not isinstance(getattr(getattr(agent, "builder", None), "nodes", None), Mapping):
        raise TypeError(
            f"teola.optimize got a {type(agent).__name__}, not a compiled LangChain agent: build it with "
            "langchain.agents.create_agent(model, tools, middleware=[TeolaMiddleware()]) "
            "(from teola_langchain.agents import TeolaMiddleware)"
        )
    found = teola_middlewares(agent)
    if not found:
        raise TypeError(
            f"teola.optimize cannot hook the agent {agent.get_name()!r}: a compiled agent keeps its model and "
            "tools in closures Teola cannot re-wire. Add Teola's middleware when building it: "
            "create_agent(model, tools, middleware=[..., TeolaMiddleware()]) "
            "(from teola_langchain.agents import TeolaMiddleware), then teola.optimize(agent)"
        )
    if len(found) > 1:
        raise TypeError(f"the agent {agent.get_name()!r} has {len(found)} TeolaMiddleware instances: add one")
    return found[0]


def tool_names(agent: Any) -> frozenset[str]:
    """The names of the tools the agent's tool node runs."""
    return frozenset(agent_tools(agent))


def agent_tools(agent: Any) -> dict[str, BaseTool]:
    """The tools the agent's tool node runs, by name."""
    tools: dict[str, BaseTool] = {}
    for spec in agent.builder.nodes.values():
        if isinstance(spec.runnable, ToolNode):
            tools.update(spec.runnable.tools_by_name)
    return tools


def _summary_run(middleware: SummarizationMiddleware) -> AgentRun | None:
    """The optimized run that runs `middleware` now (from the node's config), if any."""
    config = var_child_runnable_config.get()
    run = ((config or {}).get("configurable") or {}).get(RUN_KEY)
    return run if isinstance(run, AgentRun) and run.agent.summarization is middleware else None


def _tool_versions(tools: Mapping[str, str] | Iterable[str] | None, known: frozenset[str]) -> dict[str, str]:
    if tools is None:
        return {}
    if isinstance(tools, str):
        raise TypeError(
            f"idempotent_tools must be tool names or a mapping of name to version, not the string {tools!r}"
        )
    versions = dict(tools) if isinstance(tools, Mapping) else dict.fromkeys(tools, "")
    unknown = sorted(set(versions) - known)
    if unknown:
        raise ValueError(f"idempotent_tools names unknown tool(s) {unknown} (the agent's tools: {sorted(known)})")
    for name, version in versions.items():
        if not isinstance(version, str):
            raise TypeError(f"idempotent tool {name!r}: the version must be a string, not {version!r}")
    return versions


class _CallerTurn:
    """Runs a coroutine on `loop` while the calling thread waits; the coroutine can hand
    sync work back to that thread (`call`), which runs it in its own context.

    This is how a sync agent's model and tool calls are scheduled by Teola yet executed by
    the LangGraph thread that issued them, exactly as LangChain would execute them.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.Future[Any]] | None] = queue.SimpleQueue()

    async def call(self, work: Callable[[], T]) -> T:
        """On the loop: have the waiting thread run `work` now; its result or exception."""
        future: asyncio.Future[T] = self._loop.create_future()
        self._jobs.put((work, future))
        return await future

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """In the caller's thread: run `coro` on the loop, serving its `call`s, until it ends."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            coro.close()
            raise RuntimeError("a sync call of an optimized agent ran on its own event loop; use the async methods")
        done = asyncio.run_coroutine_threadsafe(coro, self._loop)
        done.add_done_callback(lambda _: self._jobs.put(None))
        try:
            while (job := self._jobs.get()) is not None:
                work, future = job
                try:
                    value = work()
                except Exception as exc:
                    self._loop.call_soon_threadsafe(_settle, future, None, exc)
                else:
                    self._loop.call_soon_threadsafe(_settle, future, value, None)
        except BaseException:
            done.cancel()
            raise
        return done.result()


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():  # the waiting coroutine was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


async def _in_context(context: contextvars.Context, make: Callable[[], Awaitable[T]]) -> T:
    """Await `make()` as a task in `context` (the caller's, not the engine task's)."""

    async def run() -> T:
        return await make()

    return await asyncio.get_running_loop().create_task(run(), context=context)


def _unwrap(exc: BaseException) -> BaseException:
    """The exception the agent's own call raised, with a note naming Teola's primitive."""
    while isinstance(exc, PrimitiveError):
        inner = exc.error
        inner.add_note(f"teola: raised in primitive {exc.node}")
        exc = inner
    return exc


__all__ = [
    "RUN_KEY",
    "AgentModelCall",
    "AgentModelEngine",
    "AgentRun",
    "OptimizedAgent",
    "TeolaMiddleware",
    "find_middleware",
    "optimize_agent",
    "teola_middlewares",
]
