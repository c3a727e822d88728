"""Loading the apps a server serves, and the `App` seam every framework plugs into.

The routes only know the `App` protocol: a name, an input schema (to map a request onto
the app's input), `ainvoke`/`astream`, and `attach`/`close` so the server can observe the
app's runtime on its own event loop. `LangChainApp` implements it for LangChain runnables
and `LlamaIndexApp` for LlamaIndex pipelines and query engines (each wrapped with
`teola.optimize` unless already optimized), `LangGraphApp` for compiled LangGraph graphs;
`wrap_app` picks by type. A LangChain app's
failure names the step that raised it, as LangChain's own callbacks report it (`AppFailed`).

Specs on the command line: `module:attr` (served as `attr`) or `name=module:attr`;
`attr` may be dotted (`module:holder.chain`).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, get_type_hints, is_typeddict, runtime_checkable

from pydantic import BaseModel, PydanticUserError, create_model

from teola_core.runtime.base import Runtime, RuntimeHook
from teola_core.runtime.local import LocalRuntime
from teola_core.runtime.timeouts import Timeouts


@runtime_checkable
class App(Protocol):
    """What the server needs from a served application (any framework)."""

    name: str

    def input_schema(self) -> type[BaseModel] | None:
        """The app's input model (pydantic), or None when it takes anything."""

    async def ainvoke(self, value: Any) -> Any:
        """Run one query; the result is mapped to text by `responses.to_text`."""

    def astream(self, value: Any) -> AsyncIterator[Any]:
        """Run one query, yielding chunks as the app produces them."""

    def attach(self, hook: RuntimeHook) -> None:
        """Called on the server's event loop at startup: observe the runtime that will
        run every request of this app on that loop."""

    def queue_depths(self) -> dict[str, tuple[int, int]]:
        """Per engine: (nodes waiting, batches running), for the metrics scrape."""

    async def close(self) -> None:
        """Release what the app holds for the server's loop."""


_APP_METHODS = ("input_schema", "ainvoke", "astream", "attach", "queue_depths", "close")


def is_app(obj: Any) -> bool:
    """Whether `obj` already implements `App`, read from its class without running anything.

    Not `isinstance(obj, App)`: on Python 3.11 that reads every protocol member from the
    instance, in an order set by the hash seed, and a LangChain runnable's `input_schema`
    is a property that builds a pydantic model, which raises for a graph whose state is a
    `typing.TypedDict`. So serving such a graph failed in some processes and not others.
    """
    members = (inspect.getattr_static(type(obj), method, None) for method in _APP_METHODS)
    return all(callable(member) for member in members) and isinstance(getattr(obj, "name", None), str)


class AppFailed(Exception):
    """The app raised `error`; `step` names the step that raised it, when the framework says."""

    def __init__(self, error: BaseException, step: str | None) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error
        self.step = step


class _OptimizedApp:
    """What every framework's app shares: the optimized object keeps one runtime per
    event loop, and every request on the server's loop goes through that one runtime,
    which is what lets the engine schedulers batch across requests.

    `optimized` must offer `runtime_for_current_loop()`, `engine_names` and `close()`.
    """

    name: str
    optimized: Any
    _runtime: Runtime | None = None

    def attach(self, hook: RuntimeHook) -> None:
        runtime = self.optimized.runtime_for_current_loop()
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
        schema = self.runnable.get_input_schema()
        return schema if isinstance(schema, type) and issubclass(schema, BaseModel) else None

    async def ainvoke(self, value: Any) -> Any:
        steps = failed_step_tracker()
        try:
            return await self.runnable.ainvoke(value, config={"callbacks": [steps]})
        except Exception as exc:
            raise AppFailed(exc, steps.failed) from exc

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
        return schema if isinstance(schema, type) and issubclass(schema, BaseModel) else None

    async def ainvoke(self, value: Any) -> Any:
        steps = failed_step_tracker()
        try:
            return await self.graph.ainvoke(value, config={"callbacks": [steps]})
        except Exception as exc:
            raise AppFailed(exc, steps.failed) from exc

    async def astream(self, value: Any) -> AsyncIterator[Any]:
        yield await self.ainvoke(value)

    def attach(self, hook: RuntimeHook) -> None:
        """Nothing to observe: the graph's steps run in LangGraph's loop, not on a Teola runtime."""

    def queue_depths(self) -> dict[str, tuple[int, int]]:
        return {}

    async def close(self) -> None:
        self.graph.close()


def _typed_dict_schema(graph: Any) -> type[BaseModel] | None:
    """The input fields of a `StateGraph` whose input state is a `typing.TypedDict` (values
    not checked: the graph checks them as it runs)."""
    from langgraph.graph.state import CompiledStateGraph

    source = graph.builder.input_schema if isinstance(graph, CompiledStateGraph) else None
    if not (isinstance(source, type) and is_typeddict(source)):
        return None
    required = source.__required_keys__
    fields: dict[str, Any] = {key: (Any, ... if key in required else None) for key in get_type_hints(source)}
    return create_model(f"{graph.get_name()}Input", **fields)


class AppSpecError(ValueError):
    """An app spec that cannot be served; the message says what is wrong and what to do."""


@dataclass(frozen=True)
class AppSpec:
    """`name=module:attr` parsed."""

    name: str
    module: str
    attr: str

    @classmethod
    def parse(cls, spec: str) -> AppSpec:
        name, sep, target = spec.partition("=")
        if not sep:
            name, target = "", spec
        module, colon, attr = target.partition(":")
        if not colon or not module or not attr:
            raise AppSpecError(
                f"app spec {spec!r}: expected module:attr or name=module:attr (e.g. myapp:chain, qa=pkg.rag:chain)"
            )
        return cls(name or attr.rsplit(".", 1)[-1], module, attr)


def _optimize(obj: Any, backend: str, ray: Mapping[str, Any] | None, **options: Any) -> Any:
    """`teola.optimize` with the server's backend (and Ray options, on the Ray backend)."""
    import teola

    return teola.optimize(obj, backend=backend, **options, **({} if ray is None else {"ray": ray}))


def wrap_app(name: str, obj: Any, *, backend: str = "local", ray: Mapping[str, Any] | None = None) -> App:
    """The `App` for a loaded object: already an App, or a LangChain runnable."""
    if is_app(obj):
        return obj
    if type(obj).__module__.split(".")[0] in ("llama_index", "teola_llamaindex"):
        return LlamaIndexApp(name, obj, backend=backend, ray=ray)
    try:
        from langchain_core.runnables import Runnable
    except ModuleNotFoundError as exc:
        raise AppSpecError(
            f"app {name!r} is a {type(obj).__name__}; serving LangChain apps needs pip install 'teola[langchain]'"
        ) from exc
    if any(c.__module__.split(".")[0] == "langgraph" for c in type(obj).__mro__):
        return LangGraphApp(name, obj, backend=backend, ray=ray)
    if isinstance(obj, Runnable):
        return LangChainApp(name, obj, backend=backend, ray=ray)
    raise AppSpecError(
        f"app {name!r} is a {type(obj).__name__}: expected a LangChain Runnable, a LlamaIndex query engine or "
        "pipeline, or an object with the teola.server.apps.App interface"
    )


def load_apps(
    specs: Iterable[str],
    *,
    backend: str = "local",
    search_path: str | None = None,
    ray: Mapping[str, Any] | None = None,
) -> list[App]:
    """Import every `name=module:attr` and wrap it; names must be unique. Every problem is
    an `AppSpecError` naming the spec, with a hint."""
    if search_path is not None and search_path not in sys.path:
        sys.path.insert(0, search_path)
    apps: list[App] = []
    for raw in specs:
        spec = AppSpec.parse(raw)
        obj: Any = _import(spec, raw)
        for depth, part in enumerate(spec.attr.split(".")):
            if not hasattr(obj, part):
                where = spec.module + "".join(f".{p}" for p in spec.attr.split(".")[:depth])
                public = sorted(n for n in dir(obj) if not n.startswith("_"))
                shown = ", ".join(public[:12]) + (", ..." if len(public) > 12 else "")
                raise AppSpecError(
                    f"app spec {raw!r}: {where} has no attribute {part!r} (it has: {shown or 'nothing'})"
                )
            obj = getattr(obj, part)
        if any(a.name == spec.name for a in apps):
            raise AppSpecError(
                f"app spec {raw!r}: two apps are named {spec.name!r}; name one explicitly: other_name={spec.module}:..."
            )
        apps.append(wrap_app(spec.name, obj, backend=backend, ray=ray))
    return apps


def _import(spec: AppSpec, raw: str) -> Any:
    try:
        return importlib.import_module(spec.module)
    except ModuleNotFoundError as exc:
        top = spec.module.split(".")[0]
        if exc.name is not None and (spec.module == exc.name or spec.module.startswith(f"{exc.name}.")):
            raise AppSpecError(
                f"app spec {raw!r}: no module named {exc.name!r} (hint: run teola serve in the folder that holds "
                f"{top}.py or the {top}/ package, or install it)"
            ) from None
        raise AppSpecError(
            f"app spec {raw!r}: importing {spec.module!r} failed: it needs the module {exc.name!r} "
            f"(hint: pip install it; python -c 'import {spec.module}' shows where)"
        ) from None
    except Exception as exc:
        raise AppSpecError(
            f"app spec {raw!r}: importing {spec.module!r} failed: {type(exc).__name__}: {exc} "
            f"(hint: python -c 'import {spec.module}' shows the traceback)"
        ) from None


def cwd_path() -> str:
    """Where `teola serve` imports apps from first (like `uvicorn`): the working directory."""
    return str(Path.cwd())


def failed_step_tracker() -> Any:
    """A LangChain callback handler whose `failed` is the name of the innermost run that
    raised (the step that failed), as LangChain's callbacks report it."""
    from langchain_core.callbacks import BaseCallbackHandler

    class FailedStep(BaseCallbackHandler):
        run_inline = True  # bookkeeping only: no thread hop

        def __init__(self) -> None:
            self.names: dict[Any, str] = {}
            self.failed: str | None = None

        def _start(self, serialized: Any, run_id: Any, name: str | None) -> None:
            self.names[run_id] = name or (serialized or {}).get("name") or "?"

        def _error(self, run_id: Any) -> None:
            if self.failed is None:  # children fail before their parents: the first is the step
                self.failed = self.names.get(run_id)

        def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: Any, **kw: Any) -> None:
            self._start(serialized, run_id, kw.get("name"))

        def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: Any, **kw: Any) -> None:
            self._start(serialized, run_id, kw.get("name"))

        def on_llm_start(self, serialized: Any, prompts: Any, *, run_id: Any, **kw: Any) -> None:
            self._start(serialized, run_id, kw.get("name"))

        def on_retriever_start(self, serialized: Any, query: Any, *, run_id: Any, **kw: Any) -> None:
            self._start(serialized, run_id, kw.get("name"))

        def on_tool_start(self, serialized: Any, input_str: Any, *, run_id: Any, **kw: Any) -> None:
            self._start(serialized, run_id, kw.get("name"))

        def on_chain_error(self, error: BaseException, *, run_id: Any, **kw: Any) -> None:
            self._error(run_id)

        def on_llm_error(self, error: BaseException, *, run_id: Any, **kw: Any) -> None:
            self._error(run_id)

        def on_retriever_error(self, error: BaseException, *, run_id: Any, **kw: Any) -> None:
            self._error(run_id)

        def on_tool_error(self, error: BaseException, *, run_id: Any, **kw: Any) -> None:
            self._error(run_id)

    return FailedStep()
