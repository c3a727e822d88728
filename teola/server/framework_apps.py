"""The `App` of each framework: LangChain runnables, LlamaIndex pipelines and query engines,
compiled LangGraph graphs.

`LangChainApp` and `LlamaIndexApp` wrap their object with `teola.optimize` unless it is
already optimized, and share what every optimized object offers the server (one runtime
per event loop, so requests batch together); `LangGraphApp` serves `teola.optimize(graph)`.
A LangChain or LangGraph app's failure names the step that raised it, as LangChain's own
callbacks report it (`AppFailed`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, get_type_hints, is_typeddict

from pydantic import BaseModel, PydanticUserError, create_model

from teola.server.apps import AppFailed
from teola.server.failed_step import failed_step_tracker
from teola_core.runtime.base import Runtime, RuntimeHook
from teola_core.runtime.local import LocalRuntime
from teola_core.runtime.timeouts import Timeouts


class _OptimizedApp:
    """What every framework's app shares: the optimized object keeps one runtime per
    event loop, and every request on the server's loop goes through that one runtime,
    which is what lets the engine schedulers batch across requests.

    `optimized` must offer `runtime()`, `engine_names` and `close()`.
    """

    name: str
    optimized: Any
    _runtime: Runtime | None = None

    def attach(self, hook: RuntimeHook) -> None:
        runtime = self.optimized.runtime()
        runtime.add_hook(hook)
        self._runtime = runtime

    def queue_depths(self) -> dict[str, tuple[int, int]]:
        runtime = self._runtime
        if not isinstance(runtime, LocalRuntime):
            return {}  # the reference backend has no queues
        depths = {}
        for engine in self.optimized.engine_names:
            scheduler = runtime.scheduler(engine)
            depths[engine] = (scheduler.pending, len(scheduler.running))
        return depths

    def capacity(self) -> int | None:
        """The most calls the app's busiest engine can have in flight (concurrency x max
        batch): the default bound on its concurrent queries. None: unknown (no engines)."""
        runtime = self._runtime
        if not isinstance(runtime, LocalRuntime) or not self.optimized.engine_names:
            return None
        schedulers = [runtime.scheduler(e) for e in self.optimized.engine_names]
        return max(s.concurrency * (s.max_batch_items or 1) for s in schedulers)

    def use_timeouts(self, timeouts: Timeouts) -> None:
        """Deadlines for the steps of every request on the server's loop (`--timeout`)."""
        if isinstance(self._runtime, LocalRuntime):
            self._runtime.timeouts = timeouts

    async def close(self) -> None:
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            await runtime.close()
        self.optimized.close()


class LangChainApp(_OptimizedApp):
    """A LangChain runnable served through Teola (wrapped with `teola.optimize` unless it
    already is optimized)."""

    def __init__(
        self, name: str, runnable: Any, *, backend: str = "local", ray: Mapping[str, Any] | None = None
    ) -> None:
        from teola_langchain.runnable import TeolaRunnable

        self.name = name
        self.runnable: TeolaRunnable[Any, Any] = (
            runnable
            if isinstance(runnable, TeolaRunnable)
            # on the graph: every step gets the server's deadline and is counted in /metrics
            else _optimize(runnable, backend, ray, execution="graph")
        )
        self.optimized = self.runnable

    def input_schema(self) -> type[BaseModel] | None:
        return _pydantic_model(self.runnable.get_input_schema())

    async def ainvoke(self, value: Any) -> Any:
        return await _ainvoke_naming_failed_step(self.runnable, value)

    async def astream(self, value: Any) -> AsyncIterator[Any]:
        steps = failed_step_tracker()
        try:
            async for chunk in self.runnable.astream(value, config={"callbacks": [steps]}):
                yield chunk
        except Exception as exc:
            raise AppFailed(exc, steps.failed) from exc


class LlamaIndexApp(_OptimizedApp):
    """A LlamaIndex `QueryPipeline` (0.12) or `RetrieverQueryEngine` served through Teola.

    A query engine takes the request's text as its query. A pipeline takes its root
    input keys: one key gets the text, several need a JSON object (the input schema
    lists them). The result is sent as its text (`str()` of a LlamaIndex response is
    its text); it is not streamed token by token: one chunk carries the whole answer.
    """

    def __init__(self, name: str, obj: Any, *, backend: str = "local", ray: Mapping[str, Any] | None = None) -> None:
        from teola_llamaindex import TeolaQueryEngine, TeolaQueryPipelineExecutor

        self.name = name
        optimized_types = tuple(t for t in (TeolaQueryEngine, TeolaQueryPipelineExecutor) if t is not None)
        self.optimized = obj if isinstance(obj, optimized_types) else _optimize(obj, backend, ray)
        self._is_engine = isinstance(self.optimized, TeolaQueryEngine)

    def input_schema(self) -> type[BaseModel] | None:
        if self._is_engine:
            return None
        keys = sorted(self.optimized.original.input_keys.required_keys)
        return create_model(f"{self.name}_input", **{k: (Any, ...) for k in keys})  # type: ignore[call-overload]

    async def ainvoke(self, value: Any) -> Any:
        if self._is_engine:
            result = await self.optimized.aquery(value)
        else:
            result = await self.optimized.arun(**value) if isinstance(value, dict) else await self.optimized.arun(value)
        return result if isinstance(result, str) else str(result)

    async def astream(self, value: Any) -> AsyncIterator[Any]:
        yield await self.ainvoke(value)


class LangGraphApp:
    """A compiled LangGraph graph served through `teola.optimize(graph)` (LangGraph's own loop
    runs it; Teola admits its model calls across requests). A request's input is the graph's
    input state; the answer is the final state (as JSON), streamed as one chunk."""

    def __init__(self, name: str, graph: Any, *, backend: str = "local", ray: Mapping[str, Any] | None = None) -> None:
        from teola_langchain.langgraph import OptimizedGraph

        self.name = name
        if isinstance(graph, OptimizedGraph):
            self.graph = graph
        elif backend == "local" and ray is None:
            import teola

            self.graph = teola.optimize(graph)
        else:  # Teola engines of a graph live in its LCEL chain nodes (see teola_langchain.langgraph)
            self.graph = _optimize(graph, backend, ray, runnable_nodes=True)

    def input_schema(self) -> type[BaseModel] | None:
        try:
            schema = self.graph.get_input_schema()
        except PydanticUserError:  # a typing.TypedDict state on Python < 3.12: pydantic cannot read it
            return _typed_dict_schema(self.graph)
        return _pydantic_model(schema)

    async def ainvoke(self, value: Any) -> Any:
        return await _ainvoke_naming_failed_step(self.graph, value)

    async def astream(self, value: Any) -> AsyncIterator[Any]:
        yield await self.ainvoke(value)

    def attach(self, hook: RuntimeHook) -> None:
        """Nothing to observe: the graph's steps run in LangGraph's loop, not on a Teola runtime."""

    def queue_depths(self) -> dict[str, tuple[int, int]]:
        return {}

    async def close(self) -> None:
        self.graph.close()


def _pydantic_model(schema: Any) -> type[BaseModel] | None:
    """`schema` if it is a pydantic model class (what the server validates requests with), else None."""
    return schema if isinstance(schema, type) and issubclass(schema, BaseModel) else None


async def _ainvoke_naming_failed_step(runnable: Any, value: Any) -> Any:
    """`runnable.ainvoke(value)`; a failure is raised as `AppFailed` naming the step that raised it,
    as LangChain's callbacks report it."""
    steps = failed_step_tracker()
    try:
        return await runnable.ainvoke(value, config={"callbacks": [steps]})
    except Exception as exc:
        raise AppFailed(exc, steps.failed) from exc


def _typed_dict_schema(graph: Any) -> type[BaseModel] | None:
    """The input fields of a `StateGraph` whose input state is a `typing.TypedDict`, each
    optional: LangGraph takes any part of such a state as input (a run's input is an update
    of the state's channels; the nodes read what they need). Values are not checked here:
    the graph checks them as it runs."""
    from langgraph.graph.state import CompiledStateGraph

    source = graph.builder.input_schema if isinstance(graph, CompiledStateGraph) else None
    if not (isinstance(source, type) and is_typeddict(source)):
        return None
    fields: dict[str, Any] = {key: (Any, None) for key in get_type_hints(source)}
    return create_model(f"{graph.get_name()}Input", **fields)


def _optimize(obj: Any, backend: str, ray: Mapping[str, Any] | None, **options: Any) -> Any:
    """`teola.optimize` with the server's backend (and Ray options, on the Ray backend)."""
    import teola

    return teola.optimize(obj, backend=backend, **options, **({} if ray is None else {"ray": ray}))
