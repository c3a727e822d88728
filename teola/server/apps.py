"""The `App` seam every framework plugs into: what the server needs from a served application.

The routes only know the `App` protocol: a name, an input schema (to map a request onto
the app's input), `ainvoke`/`astream`, and `attach`/`close` so the server can observe the
app's runtime on its own event loop. The frameworks' apps are in `framework_apps`;
`app_loading` imports the apps named on the command line and wraps each in its `App`.
An app's failure names the step that raised it, when the framework says (`AppFailed`).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel

from teola_core.runtime.base import RuntimeHook


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
