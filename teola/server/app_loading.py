"""Loading the apps a server serves: `module:attr` specs imported and wrapped in their `App`.

Specs on the command line: `module:attr` (served as `attr`) or `name=module:attr`;
`attr` may be dotted (`module:holder.chain`). `wrap_app` picks the framework's `App` by
the object's type. Every problem is an `AppSpecError` naming the spec, with a hint.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from teola.server.apps import App, is_app
from teola.server.framework_apps import LangChainApp, LangGraphApp, LlamaIndexApp


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
