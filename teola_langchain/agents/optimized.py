"""`OptimizedAgent`, `optimize_agent`: the optimized agent (a use: this package's docstring).

`optimize(agent)` finds the agent's `TeolaMiddleware` (`teola_langchain.agents.middleware`
says why a middleware); an agent without it runs as any compiled graph does under
`teola.optimize` (`teola_langchain.langgraph`), and its `explain()` says what to add.

A call of the optimized agent starts one `Program` (one `AgentRun`) on the `AgentRuntime`
of the event loop it runs on, passes the run to the middleware in the run's config, runs
the agent as LangChain runs it, and finishes the program. Async methods run the program
on the caller's loop; sync methods on a loop the optimized agent owns in a daemon thread
(`teola_langchain.agents.caller_turn`: the calls still run in the caller's thread). One
`AgentRuntime` per event loop (its runtime and tool cache hold loop-bound futures): runs
share the tool cache and the engine's scheduler with the runs on the same loop (all sync
calls share one). `optimize` wraps the agent's `SummarizationMiddleware` so that its
summaries can be computed ahead (`teola_langchain.agents.run`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

from langchain.agents.middleware import SummarizationMiddleware
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import var_child_runnable_config

from teola_adapters.server_load import ServerFoundLater
from teola_core.agents import AgentDropIn, AgentFeatures, Program
from teola_core.runtime.backends import DEFAULT_BACKEND
from teola_langchain.agents.engine import AgentModelEngine
from teola_langchain.agents.graph import agent_tools, find_middleware, tool_names
from teola_langchain.agents.middleware import TeolaMiddleware
from teola_langchain.agents.run import AgentRun, run_in
from teola_langchain.agents.summarization import find_summarization, install_hooks
from teola_langchain.same_structure import SameStructure

AUTO_START = 64  # model calls at once before (or without) a server to learn from


class OptimizedAgent(AgentDropIn, SameStructure, Runnable[Any, Any]):
    """A LangChain agent whose model and tool calls run on Teola (see the module docstring).

    Options:
        idempotent_tools: tools whose result depends only on their arguments, by name
            with a version (`{"read_file": "v1"}`: a new version drops old results), or
            an iterable of names (version ""). Their results are shared across runs.
        features: which agent-runtime optimizations apply (`AgentFeatures`, all by default).
        priority_rule: "fcfs" (program start) or "plas" (least model time first).
        model_concurrency: model calls running at once; beyond it calls wait in
            program-priority order. "auto" (the default): 64, and for a langchain-openai
            model on a vLLM-like server what the server runs at once, learned from its
            `/metrics` from the first call on (as for LangGraph graphs).
        on_program: called with each run's `Program` when the run ends (stats, steps).
        backend, ray: where the runs' graphs run (`teola.optimize`'s options for chains); the
            agent's model stays in the driver, where the middleware calls it.
    """

    def __init__(
        self,
        agent: Any,
        *,
        idempotent_tools: Mapping[str, str] | Iterable[str] | None = None,
        features: AgentFeatures | None = None,
        priority_rule: Literal["fcfs", "plas"] = "fcfs",
        model_concurrency: int | Literal["auto"] = "auto",
        on_program: Callable[[Program], None] | None = None,
        backend: str = DEFAULT_BACKEND,
        ray: Any = None,
    ) -> None:
        self.name = agent.get_name()
        super().__init__(self.name, features, priority_rule)
        self.original = agent
        self.middleware = find_middleware(agent)
        self.idempotent_tools = _tool_versions(idempotent_tools, tool_names(agent))
        self.direct_tools = frozenset(name for name, t in agent_tools(agent).items() if t.return_direct)
        self.summarization = find_summarization(agent)
        if self.summarization is not None:
            install_hooks(self.summarization, _summary_run)
        self.on_program = on_program
        self.engine_name = f"llm:{self.name}"
        if model_concurrency == "auto":
            engine = AgentModelEngine(self.engine_name, AUTO_START, ServerFoundLater())
        else:
            engine = AgentModelEngine(self.engine_name, model_concurrency)
        self.engines.add(engine)
        self.place_engines(self.engines, backend=backend, ray=ray)
        self.start_sync_thread(f"teola-agent:{self.name}")
        self._sync_loop: asyncio.AbstractEventLoop | None = None

    # -- structure ---------------------------------------------------------------------
    @property
    def _wrapped(self) -> Any:
        return self.original

    def get_graph(self, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return self.original.get_graph(config, **kwargs)

    def close(self) -> None:
        """Close the sync methods' agent runtime, stop their loop thread and kill any Ray actors
        (all restart if used again)."""
        if self._sync_loop is not None:
            self.sync_thread.run(self._close_current_runtime())
            self._sync_loop = None
        super().close()

    # -- runs --------------------------------------------------------------------------
    def _open(self, *, sync: bool = False) -> AgentRun:
        """Start a run on the running loop."""
        return AgentRun(self, self.runtime().program(), asyncio.get_running_loop(), sync=sync)

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
        run = self.sync_thread.run(self._aopen())
        self._sync_loop = run.loop
        try:
            yield run
        finally:
            self.sync_thread.run(self._aend(run))
            self._ended(run.program)

    # -- call surface ------------------------------------------------------------------
    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        with self._sync_run() as run:
            return self.original.invoke(input, run.config(config), **kwargs)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        run = self._open()
        try:
            return await self.original.ainvoke(input, run.config(config), **kwargs)
        finally:
            self._finish(run)

    def stream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[Any]:
        with self._sync_run() as run:
            yield from self.original.stream(input, run.config(config), **kwargs)

    async def astream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> AsyncIterator[Any]:
        run = self._open()
        try:
            async for chunk in self.original.astream(input, run.config(config), **kwargs):
                yield chunk
        finally:
            self._finish(run)


def optimize_agent(agent: Any, **options: Any) -> OptimizedAgent:
    """`teola.optimize` for LangGraph graphs: a LangChain agent built with `TeolaMiddleware`."""
    return OptimizedAgent(agent, **options)


def _summary_run(middleware: SummarizationMiddleware) -> AgentRun | None:
    """The optimized run that runs `middleware` now (from the node's config), if any."""
    run = run_in(var_child_runnable_config.get())
    return run if run is not None and run.agent.summarization is middleware else None


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


__all__ = ["OptimizedAgent", "TeolaMiddleware", "optimize_agent"]
