"""`optimize(chain)`: a drop-in LangChain `Runnable` that runs the chain as Teola graphs.

    from teola import optimize
    fast = optimize(chain)                    # traced once, here; nothing runs yet
    fast.invoke({"question": "..."})          # same result as chain.invoke
    await fast.abatch(questions, {"max_concurrency": 8})
    print(fast.explain())                     # p-graph, passes, e-graph, Mermaid

    fast = optimize(chain, engines=[(llm, my_engine)])   # run a component on an engine you choose

What a call does: it opens one callback run for the chain (as the chain itself would,
with its name, tags and metadata), runs the traced graph on the runtime backend with
the run's child config handed to every user step and model call, and returns the
graph's output. `batch`/`abatch` run every input as a concurrent query on one runtime
(so the engine schedulers can batch across them), at most `max_concurrency` at a time;
an input that fails does not stop the others, and errors are returned or raised as
LangChain does (`return_exceptions`).

`stream`/`astream` run the steps before the chain's streaming tail (its last model
and the parsers or generators after it) as a graph and stream the tail with LangChain
itself (`models.streaming_split`), so the chunks are LangChain's. A chain without such
a tail yields its output as one chunk. Either way only where LangChain's stream of the
graph part provably adds up to its invoke (`models.streams_as_invoked`); otherwise the
original chain streams, unoptimized, and `explain()` says so.

Callbacks and modes: the chain's run is reported as the original chain would report it;
the steps Teola calls as they are (models, lambdas, opaque steps) report their runs as
its children, with the caller's tags and metadata; what Teola computes itself
(composition, prompt rendering, recognised parsers, decomposed retrievers) opens no run
of its own. Sync methods run user steps through their sync `invoke` (in worker
threads), async methods through `ainvoke`, as LangChain does; models are always called
with `ainvoke`.

Exceptions raised by a user's step reach the caller as that very exception (Teola's
`PrimitiveError` is unwrapped), with a note naming the primitive and step.

Not traced, delegated to the original chain: calls with extra `**kwargs` (LangChain
passes them to the first step only). Sync methods run the graph on an event loop the
runnable owns in a daemon thread (one per runnable, started on first use; `close()`
stops it); async methods run on the caller's loop. There is no global state.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast
from uuid import uuid4

from langchain_core.callbacks import AsyncCallbackManagerForChainRun, CallbackManagerForChainRun
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.base import Input, Output, coerce_to_runnable
from langchain_core.runnables.config import (
    ensure_config,
    get_async_callback_manager_for_config,
    get_callback_manager_for_config,
    get_config_list,
    patch_config,
)
from langchain_core.runnables.graph import Graph as LCGraph

from teola_core.ir.draw import draw_graph
from teola_core.profiles.profile import LatencyProfile
from teola_core.runtime.backends import BACKENDS, DEFAULT_BACKEND, RuntimePerLoop
from teola_core.runtime.base import Runtime, RuntimeHook
from teola_core.runtime.loop_thread import LoopThread
from teola_langchain.context import ContextRegistry, QueryContext
from teola_langchain.engines import EngineChoices, EngineOption, EngineRegistry
from teola_langchain.explain import mermaid, section
from teola_langchain.models import streaming_split, streams_as_invoked
from teola_langchain.steps import run_graph
from teola_langchain.tracer import SubGraph, TracedChain, TraceSession


class TeolaRunnable(Runnable[Input, Output]):
    """A LangChain runnable that runs a traced chain on Teola (see the module docstring).

    Options:
        backend: "local" (the default: scheduled, batching), "ray" (engines as Ray
            actors) or "reference" (one primitive at a time).
        policy: the local runtime's engine scheduling policy ("topology", "fifo", ...).
        passes: True (the default pipeline), False (none) or a `PassManager`.
        profiles: latency profiles by engine name ("llm:ChatOpenAI", "embed:...",
            see `explain()`), so the passes can plan; the user's components have none.
        expected_items: how many items a model with a list parser is expected to write
            (enables decode pipelining; results never depend on it).
        warn: warn once for each step that stays opaque.
        hooks: runtime hooks (e.g. `teola_core.runtime.timeline.SpanRecorder`) added to
            every runtime this runnable creates: they see each primitive's span.
        engines: which Teola engine runs a model, embeddings object or vector store of
            the chain: `(component, engine)` pairs (a list; a dict if the components are
            hashable), or a function `(component, default_engine) -> engine | None`. A
            `VLLMHTTPEngine` given for a model keeps LangChain's answers and warms that
            vLLM server's prefix cache. See `teola_langchain.engines.EngineChoices`.
    """

    def __init__(
        self,
        runnable: Runnable[Input, Output] | Any,
        *,
        backend: str = DEFAULT_BACKEND,
        policy: str = "topology",
        passes: Any = True,
        profiles: Mapping[str, LatencyProfile] | None = None,
        expected_items: int | None = None,
        warn: bool = True,
        hooks: Sequence[RuntimeHook] = (),
        engines: EngineOption = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
        original = cast("Runnable[Input, Output]", coerce_to_runnable(runnable))
        self.original = original
        self.name = original.get_name()
        self.backend = backend
        self.policy = policy
        self._contexts = ContextRegistry()
        choices = EngineChoices(engines)
        self._engines = EngineRegistry(self._contexts, choices)
        session = TraceSession(self._engines, warn=warn, expected_items=expected_items)
        self.plan: TracedChain = session.trace(original)
        self.stream_head: TracedChain | None = None
        self._tail: Runnable[Any, Any] | None = None
        self._stream_original = False
        split = streaming_split(original)
        if split is None:
            self._stream_original = not streams_as_invoked(original)
        elif split[0] is None or streams_as_invoked(split[0]):
            head, self._tail = split
            if head is not None:
                self.stream_head = session.trace(head, name=f"{self.name}:stream-head")
        else:
            self._stream_original = True
        unused = choices.unused()
        if unused:
            raise ValueError(
                "engines= names components that no traced step runs on an engine (matched by identity: "
                "the chain does not use them, or only inside a step Teola runs as one opaque call, see "
                "explain()): " + ", ".join(type(c).__name__ for c in unused)
            )
        self.profiles = {**self._engines.engines.profiles(), **(profiles or {})}
        for sub in self._graphs():
            _optimize_graph(sub, passes, self.profiles)
        self._runtimes = RuntimePerLoop(self._engines.engines, backend, policy, hooks)
        self._thread = LoopThread(f"teola:{self.name}")
        self._finalizer = weakref.finalize(self, self._thread.close)

    # -- structure -------------------------------------------------------------------
    @property
    def InputType(self) -> Any:
        return self.original.InputType

    @property
    def OutputType(self) -> Any:
        return self.original.OutputType

    def get_input_schema(self, config: RunnableConfig | None = None) -> Any:
        return self.original.get_input_schema(config)

    def get_output_schema(self, config: RunnableConfig | None = None) -> Any:
        return self.original.get_output_schema(config)

    @property
    def config_specs(self) -> Any:
        return self.original.config_specs

    def get_graph(self, config: RunnableConfig | None = None) -> LCGraph:
        """The original chain's graph (what the user wrote); `explain()` shows Teola's."""
        return self.original.get_graph(config)

    def explain(self, png_dir: str | Path | None = None) -> str:
        """The p-graph, the passes applied and the e-graph of every traced graph, with Mermaid.

        With `png_dir`, each e-graph is also drawn as a PNG there (matplotlib), and the
        text names the files. For a timeline of a run, pass `hooks=[SpanRecorder()]` to
        `optimize` and plot its spans with `teola_core.runtime.timeline.plot_timeline`.
        """
        out = [f"Teola plan for {self.name} (backend {self.backend}, policy {self.policy})\n"]
        if self.plan.opaque:
            out.append(section("opaque steps (run as one call each)", "\n".join(f"- {o}" for o in self.plan.opaque)))
        engines = [f"- {name}: {type(e).__name__}" for name, e in self._engines.engines.engines.items()]
        out.append(section("engines (profiles are keyed by these names)", "\n".join(engines) or "- none"))
        out.append(section("stream", self._stream_plan()))
        for sub in self._graphs():
            out.append(section(f"p-graph {sub.name}", sub.pgraph.summary()))
            out.append(section(f"passes applied to {sub.name}", "\n".join(f"- {p}" for p in sub.passes) or "- none"))
            out.append(section(f"e-graph {sub.name}", sub.graph.summary()))
            out.append(section(f"mermaid {sub.name}", mermaid(sub.graph)))
            if png_dir is not None:
                path = draw_graph(sub.graph, Path(png_dir) / f"{_file_name(sub.name)}-egraph.png")
                out.append(section(f"picture {sub.name}", str(path)))
        return "\n".join(out)

    def _stream_plan(self) -> str:
        if self._stream_original:
            return (
                "the original chain streams (LangChain's stream of a step in it differs from its invoke, "
                "see models.streams_as_invoked)"
            )
        if self._tail is None:
            return "no streaming tail: stream() yields the graph's output as one chunk"
        if self.stream_head is None:
            return f"the whole chain is its streaming tail: LangChain streams {self._tail.get_name()}"
        return f"graph {self.stream_head.main.name!r}, then LangChain streams the tail {self._tail.get_name()}"

    def _graphs(self) -> list[SubGraph]:
        graphs = self.plan.graphs()
        if self.stream_head is not None:
            graphs += self.stream_head.graphs()
        return graphs

    def close(self) -> None:
        """Stop the event-loop thread of the sync methods (it restarts if used again)."""
        self._thread.close()

    @property
    def engine_names(self) -> tuple[str, ...]:
        """The names of the engines the traced chain runs on."""
        return self._runtimes.engine_names

    def runtime_for_current_loop(self) -> Runtime:
        """The runtime that serves async calls made on the running event loop.

        One runtime per event loop (runtimes hold loop-bound futures); observers such
        as a server's metrics attach their hooks to it.
        """
        return self._runtime()

    # -- execution -------------------------------------------------------------------
    def _runtime(self) -> Runtime:
        return self._runtimes.current()

    async def _execute(self, graph: SubGraph, value: Any, config: RunnableConfig, sync: bool) -> Any:
        ctx = QueryContext(uuid4().hex, config, sync, self._runtime(), self._contexts)
        return await run_graph(graph, value, ctx)

    async def _gather(
        self, inputs: Sequence[Any], configs: Sequence[RunnableConfig], limit: int | None, sync: bool
    ) -> list[Any]:
        semaphore = asyncio.Semaphore(limit) if limit else None

        async def one(value: Any, config: RunnableConfig) -> Any:
            if semaphore is None:
                return await self._execute(self.plan.main, value, config, sync)
            async with semaphore:
                return await self._execute(self.plan.main, value, config, sync)

        return list(
            await asyncio.gather(*(one(v, c) for v, c in zip(inputs, configs, strict=True)), return_exceptions=True)
        )

    # -- invoke ----------------------------------------------------------------------
    def invoke(self, input: Input, config: RunnableConfig | None = None, **kwargs: Any) -> Output:
        if kwargs:
            return self.original.invoke(input, config, **kwargs)
        return self._call_with_config(self._invoke, input, config)

    def _invoke(self, value: Any, run_manager: CallbackManagerForChainRun, config: RunnableConfig) -> Any:
        child = patch_config(config, callbacks=run_manager.get_child())
        return self._thread.run(self._execute(self.plan.main, value, child, sync=True))

    async def ainvoke(self, input: Input, config: RunnableConfig | None = None, **kwargs: Any) -> Output:
        if kwargs:
            return await self.original.ainvoke(input, config, **kwargs)
        return await self._acall_with_config(self._ainvoke, input, config)

    async def _ainvoke(self, value: Any, run_manager: AsyncCallbackManagerForChainRun, config: RunnableConfig) -> Any:
        child = patch_config(config, callbacks=run_manager.get_child())
        return await self._execute(self.plan.main, value, child, sync=False)

    # -- batch -----------------------------------------------------------------------
    def batch(
        self,
        inputs: list[Input],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Output]:
        if not inputs:
            return []
        if kwargs:
            return self.original.batch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        configs = get_config_list(config, len(inputs))
        runs = []
        for value, c in zip(inputs, configs, strict=True):
            manager = get_callback_manager_for_config(c)
            runs.append(
                manager.on_chain_start(
                    None, value, name=c.get("run_name") or self.get_name(), run_id=c.pop("run_id", None)
                )
            )
        children = [patch_config(c, callbacks=rm.get_child()) for c, rm in zip(configs, runs, strict=True)]
        results = self._thread.run(self._gather(inputs, children, configs[0].get("max_concurrency"), sync=True))
        for rm, result in zip(runs, results, strict=True):
            if isinstance(result, BaseException):
                rm.on_chain_error(result)
            else:
                rm.on_chain_end(result)
        return _batch_results(results, return_exceptions)

    async def abatch(
        self,
        inputs: list[Input],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Output]:
        if not inputs:
            return []
        if kwargs:
            return await self.original.abatch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        configs = get_config_list(config, len(inputs))
        runs = []
        for value, c in zip(inputs, configs, strict=True):
            manager = get_async_callback_manager_for_config(c)
            runs.append(
                await manager.on_chain_start(
                    None, value, name=c.get("run_name") or self.get_name(), run_id=c.pop("run_id", None)
                )
            )
        children = [patch_config(c, callbacks=rm.get_child()) for c, rm in zip(configs, runs, strict=True)]
        results = await self._gather(inputs, children, configs[0].get("max_concurrency"), sync=False)
        for rm, result in zip(runs, results, strict=True):
            if isinstance(result, BaseException):
                await rm.on_chain_error(result)
            else:
                await rm.on_chain_end(result)
        return _batch_results(results, return_exceptions)

    # -- stream ----------------------------------------------------------------------
    def stream(self, input: Input, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[Output]:
        if kwargs or self._stream_original:
            yield from self.original.stream(input, config, **kwargs)
            return
        if self._tail is None:
            yield self.invoke(input, config)
            return
        config = ensure_config(config)
        manager = get_callback_manager_for_config(config)
        rm = manager.on_chain_start(
            None, input, name=config.get("run_name") or self.get_name(), run_id=config.pop("run_id", None)
        )
        child = patch_config(config, callbacks=rm.get_child())
        final: Any = None
        started = False
        try:
            value = input
            if self.stream_head is not None:
                value = self._thread.run(self._execute(self.stream_head.main, input, child, sync=True))
            for chunk in self._tail.stream(value, child):
                final, started = _accumulate(final, chunk, started)
                yield chunk
        except BaseException as exc:
            rm.on_chain_error(exc)
            raise
        rm.on_chain_end(final)

    async def astream(self, input: Input, config: RunnableConfig | None = None, **kwargs: Any) -> AsyncIterator[Output]:
        if kwargs or self._stream_original:
            async for chunk in self.original.astream(input, config, **kwargs):
                yield chunk
            return
        if self._tail is None:
            yield await self.ainvoke(input, config)
            return
        config = ensure_config(config)
        manager = get_async_callback_manager_for_config(config)
        rm = await manager.on_chain_start(
            None, input, name=config.get("run_name") or self.get_name(), run_id=config.pop("run_id", None)
        )
        child = patch_config(config, callbacks=rm.get_child())
        final: Any = None
        started = False
        try:
            value = input
            if self.stream_head is not None:
                value = await self._execute(self.stream_head.main, input, child, sync=False)
            async for chunk in self._tail.astream(value, child):
                final, started = _accumulate(final, chunk, started)
                yield chunk
        except BaseException as exc:
            await rm.on_chain_error(exc)
            raise
        await rm.on_chain_end(final)


def _accumulate(final: Any, chunk: Any, started: bool) -> tuple[Any, bool]:
    """The run's output so far, added up as LangChain adds stream chunks."""
    if not started:
        return chunk, True
    try:
        return final + chunk, True
    except TypeError:
        return chunk, True


def _batch_results(results: list[Any], return_exceptions: bool) -> list[Any]:
    """LangChain's batch contract: errors in place, or the first one raised."""
    for result in results:
        if isinstance(result, BaseException) and (not return_exceptions or not isinstance(result, Exception)):
            raise result
    return results


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "graph"


def _optimize_graph(sub: SubGraph, passes: Any, profiles: Mapping[str, LatencyProfile]) -> None:
    """Run the pass pipeline on one traced graph (when the core's pass manager is there)."""
    if passes is False:
        sub.passes = ["(passes disabled)"]
        return
    try:
        from teola_core.passes import PassContext, PassManager
    except ImportError:
        sub.passes = ["(no pass manager in this teola_core: the e-graph is the p-graph)"]
        return
    manager = passes if isinstance(passes, PassManager) else PassManager()
    result = manager.optimize(sub.pgraph, PassContext(profiles=profiles))
    sub.graph = result.e_graph
    sub.passes = [*(f"applied {name}" for name in result.applied), *result.notes]


def optimize(runnable: Runnable[Any, Any] | Any, **options: Any) -> Runnable[Any, Any]:
    """Trace `runnable` (any LangChain runnable, or a dict of them) and return its drop-in.

    Options: see `TeolaRunnable`. A LangGraph graph (a LangChain agent from
    `create_agent`) goes to `teola_langchain.agents` (options: see `OptimizedAgent`).
    """
    if any(c.__module__.split(".")[0] == "langgraph" for c in type(runnable).__mro__):
        try:
            from teola_langchain.agents import optimize_agent
        except ModuleNotFoundError as exc:
            if exc.name is not None and exc.name.split(".")[0] == "langchain":
                raise ModuleNotFoundError(
                    "teola.optimize(agent) needs langchain 1.x: pip install 'teola[langchain]'", name=exc.name
                ) from exc
            raise
        return optimize_agent(runnable, **options)
    return TeolaRunnable(runnable, **options)
