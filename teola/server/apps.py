"""Loading the apps a server serves, and the `App` seam every framework plugs into.

The routes only know the `App` protocol: a name, an input schema (to map a request onto
the app's input), `ainvoke`/`astream`, and `attach`/`close` so the server can observe the
app's runtime on its own event loop. `LangChainApp` implements it for LangChain runnables
and `LlamaIndexApp` for LlamaIndex pipelines and query engines (each wrapped with
`teola.optimize` unless already optimized); `wrap_app` picks by type.

Specs on the command line: `module:attr` (served as `attr`) or `name=module:attr`;
`attr` may be dotted (`module:holder.chain`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, create_model

from teola_core.runtime.base import Runtime, RuntimeHook
from teola_core.runtime.local import LocalRuntime


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
            runnable if isinstance(runnable, TeolaRunnable) else _optimize(runnable, backend, ray)
        )
        self.optimized = self.runnable

    def input_schema(self) -> type[BaseModel] | None:
        schema = self.runnable.get_input_schema()
        return schema if isinstance(schema, type) and issubclass(schema, BaseModel) else None

    async def ainvoke(self, value: Any) -> Any:
        return await self.runnable.ainvoke(value)

    async def astream(self, value: Any) -> AsyncIterator[Any]:
        async for chunk in self.runnable.astream(value):
            yield chunk


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
            raise ValueError(f"app spec {spec!r}: expected module:attr or name=module:attr")
        return cls(name or attr.rsplit(".", 1)[-1], module, attr)


def _optimize(obj: Any, backend: str, ray: Mapping[str, Any] | None) -> Any:
    """`teola.optimize` with the server's backend (and Ray options, on the Ray backend)."""
    import teola

    return teola.optimize(obj, backend=backend, **({} if ray is None else {"ray": ray}))


def wrap_app(name: str, obj: Any, *, backend: str = "local", ray: Mapping[str, Any] | None = None) -> App:
    """The `App` for a loaded object: already an App, or a LangChain runnable."""
    if isinstance(obj, App):
        return obj
    if type(obj).__module__.split(".")[0] in ("llama_index", "teola_llamaindex"):
        return LlamaIndexApp(name, obj, backend=backend, ray=ray)
    try:
        from langchain_core.runnables import Runnable
    except ModuleNotFoundError as exc:
        raise TypeError(
            f"app {name!r} is a {type(obj).__name__}; serving LangChain apps needs pip install 'teola[langchain]'"
        ) from exc
    if isinstance(obj, Runnable):
        return LangChainApp(name, obj, backend=backend, ray=ray)
    raise TypeError(
        f"app {name!r} is a {type(obj).__name__}: expected a LangChain Runnable or an object with the "
        "teola.server.apps.App interface"
    )


def load_apps(
    specs: Iterable[str],
    *,
    backend: str = "local",
    search_path: str | None = None,
    ray: Mapping[str, Any] | None = None,
) -> list[App]:
    """Import every `name=module:attr` and wrap it; names must be unique."""
    if search_path is not None and search_path not in sys.path:
        sys.path.insert(0, search_path)
    apps: list[App] = []
    for raw in specs:
        spec = AppSpec.parse(raw)
        obj: Any = importlib.import_module(spec.module)
        for part in spec.attr.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError as exc:
                raise ValueError(f"app spec {raw!r}: module {spec.module!r} has no attribute {spec.attr!r}") from exc
        if any(a.name == spec.name for a in apps):
            raise ValueError(f"two apps are named {spec.name!r}; name one explicitly: other_name={spec.module}:...")
        apps.append(wrap_app(spec.name, obj, backend=backend, ray=ray))
    return apps


def cwd_path() -> str:
    """Where `teola serve` imports apps from first (like `uvicorn`): the working directory."""
    return str(Path.cwd())
