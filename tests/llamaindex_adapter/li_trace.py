"""What a LlamaIndex user's tracing tools see: spans, instrumentation events, callback events.

    with Recorder() as seen:
        engine.query("why?")
    seen.tree()   # comparable across runs: ids replaced by span names, in order

A span handler and an event handler on LlamaIndex's root dispatcher (what Phoenix,
Langfuse and the like attach) and a legacy `CallbackHandler` (for a `CallbackManager`).
"""

from __future__ import annotations

import re
from typing import Any

from llama_index.core.callbacks.base_handler import BaseCallbackHandler
from pydantic import PrivateAttr
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.span.simple import SimpleSpan
from llama_index.core.instrumentation.span_handlers import BaseSpanHandler

_UUID = re.compile(r"-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _name(span_id: str | None) -> str | None:
    return None if span_id is None else _UUID.sub("", span_id)


class _Spans(BaseSpanHandler[SimpleSpan]):
    _log: list[tuple[Any, ...]] = PrivateAttr(default_factory=list)

    def new_span(self, id_: str, bound_args: Any, instance: Any = None, parent_span_id: str | None = None, **kw: Any):
        self._log.append(("span", _name(id_), "parent", _name(parent_span_id)))
        return SimpleSpan(id_=id_, parent_id=parent_span_id)

    def prepare_to_exit_span(self, id_: str, bound_args: Any, instance: Any = None, result: Any = None, **kw: Any):
        self._log.append(("exit", _name(id_)))

    def prepare_to_drop_span(self, id_: str, bound_args: Any, instance: Any = None, err: Any = None, **kw: Any):
        self._log.append(("drop", _name(id_), type(err).__name__))


class _Events(BaseEventHandler):
    _log: list[tuple[Any, ...]] = PrivateAttr(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "RecorderEvents"

    def handle(self, event: Any, **kwargs: Any) -> None:
        self._log.append(("event", event.class_name(), "in", _name(event.span_id)))


class CallbackRecorder(BaseCallbackHandler):
    """Legacy callback events, as (start|end, event type, parent event type)."""

    def __init__(self) -> None:
        super().__init__([], [])
        self.log: list[tuple[Any, ...]] = []
        self._types: dict[str, str] = {}

    def on_event_start(self, event_type: Any, payload: Any = None, event_id: str = "", parent_id: str = "", **kw: Any):
        self._types[event_id] = str(event_type)
        self.log.append(("cb-start", str(event_type), "under", self._types.get(parent_id, parent_id)))
        return event_id

    def on_event_end(self, event_type: Any, payload: Any = None, event_id: str = "", **kw: Any) -> None:
        self.log.append(("cb-end", str(event_type)))

    def start_trace(self, trace_id: str | None = None) -> None:
        self.log.append(("cb-trace", trace_id))

    def end_trace(self, trace_id: str | None = None, trace_map: Any = None) -> None:
        self.log.append(("cb-end-trace", trace_id))


class Recorder:
    """Records spans and events on the root dispatcher while entered (see the module docstring)."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self._spans = _Spans()
        self._events = _Events()
        self._spans._log = self._events._log = self.log

    def __enter__(self) -> Recorder:
        root = get_dispatcher()
        root.add_span_handler(self._spans)
        root.add_event_handler(self._events)
        return self

    def __exit__(self, *exc: Any) -> None:
        root = get_dispatcher()
        root.span_handlers.remove(self._spans)
        root.event_handlers.remove(self._events)

    def tree(self) -> list[tuple[Any, ...]]:
        return list(self.log)
