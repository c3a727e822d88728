"""What a LlamaIndex user's tracing tools see: spans, instrumentation events, callback events.

    with Recorder() as seen:
        engine.query("why?")
    seen.tree()   # comparable across runs: ids replaced by span names, in order

A span handler and an event handler on LlamaIndex's root dispatcher (what Phoenix,
Langfuse and the like attach) and a legacy `CallbackHandler` (for a `CallbackManager`).
With `details=True` they also record what those tools store: a span's arguments, instance,
tags and result or error, an event's fields, a callback event's payload and the callback
trace map (`summary`: ids and times aside).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Any

from llama_index.core.callbacks.base_handler import BaseCallbackHandler
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.span.simple import SimpleSpan
from llama_index.core.instrumentation.span_handlers import BaseSpanHandler
from pydantic import BaseModel, PrivateAttr

_UUID = re.compile(r"-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _name(span_id: str | None) -> str | None:
    return None if span_id is None else _UUID.sub("", span_id)


def summary(value: Any) -> Any:
    """A comparable, id-free picture of a recorded value (models and dataclasses by their fields)."""
    if isinstance(value, BaseException):
        return ("error", type(value).__name__, str(value))
    if isinstance(value, enum.Enum):
        return str(value)
    if isinstance(value, str | int | float | bool | None):
        return value
    if isinstance(value, dict):
        return tuple(sorted((str(k), summary(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(summary(v) for v in value)
    if isinstance(value, BaseModel):
        try:
            return (type(value).__name__, summary(value.model_dump()))
        except Exception:
            return type(value).__name__
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, summary({f.name: getattr(value, f.name) for f in dataclasses.fields(value)}))
    return type(value).__name__


class _Spans(BaseSpanHandler[SimpleSpan]):
    _log: list[tuple[Any, ...]] = PrivateAttr(default_factory=list)
    _details: bool = PrivateAttr(default=False)

    def new_span(
        self, id_: str, bound_args: Any, instance: Any = None, parent_span_id: str | None = None, tags: Any = None, **kw
    ):
        more = (summary(dict(bound_args.arguments)), type(instance).__name__, summary(tags)) if self._details else ()
        self._log.append(("span", id_, "parent", parent_span_id, *more))
        return SimpleSpan(id_=id_, parent_id=parent_span_id)

    def prepare_to_exit_span(self, id_: str, bound_args: Any, instance: Any = None, result: Any = None, **kw: Any):
        self._log.append(("exit", id_, *((summary(result),) if self._details else ())))

    def prepare_to_drop_span(self, id_: str, bound_args: Any, instance: Any = None, err: Any = None, **kw: Any):
        self._log.append(("drop", id_, type(err).__name__, *((summary(err),) if self._details else ())))


class _Events(BaseEventHandler):
    _log: list[tuple[Any, ...]] = PrivateAttr(default_factory=list)
    _details: bool = PrivateAttr(default=False)

    @classmethod
    def class_name(cls) -> str:
        return "RecorderEvents"

    def handle(self, event: Any, **kwargs: Any) -> None:
        more = (summary(event.model_dump(exclude={"id_", "timestamp", "span_id"})),) if self._details else ()
        self._log.append(("event", event.class_name(), "in", event.span_id, *more))


class CallbackRecorder(BaseCallbackHandler):
    """Legacy callback events, as (start|end, event type, parent event type); with `details`,
    their payloads and the trace map (event types for ids) too."""

    def __init__(self, details: bool = False) -> None:
        super().__init__([], [])
        self.log: list[tuple[Any, ...]] = []
        self.details = details
        self._types: dict[str, str] = {}

    def on_event_start(self, event_type: Any, payload: Any = None, event_id: str = "", parent_id: str = "", **kw: Any):
        self._types[event_id] = str(event_type)
        parent = self._types.get(parent_id, parent_id if parent_id == "root" else "another manager's event")
        self.log.append(("cb-start", str(event_type), "under", parent, *self._payload(payload)))
        return event_id

    def on_event_end(self, event_type: Any, payload: Any = None, event_id: str = "", **kw: Any) -> None:
        self.log.append(("cb-end", str(event_type), *self._payload(payload)))

    def start_trace(self, trace_id: str | None = None) -> None:
        self.log.append(("cb-trace", trace_id))

    def end_trace(self, trace_id: str | None = None, trace_map: Any = None) -> None:
        if not self.details:
            self.log.append(("cb-end-trace", trace_id))
            return
        types = self._types
        shape = sorted((types.get(p, p), tuple(types.get(c, c) for c in cs)) for p, cs in (trace_map or {}).items())
        self.log.append(("cb-end-trace", trace_id, tuple(shape)))

    def _payload(self, payload: Any) -> tuple[Any, ...]:
        return (summary(payload),) if self.details else ()


class Recorder:
    """Records spans and events on the root dispatcher while entered (see the module docstring)."""

    def __init__(self, details: bool = False) -> None:
        self.log: list[tuple[Any, ...]] = []
        self._spans = _Spans()
        self._events = _Events()
        self._spans._log = self._events._log = self.log
        self._spans._details = self._events._details = details

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
        """The log in order, span ids replaced by span names (for runs with no concurrency)."""
        named = []
        for entry in self.log:
            if entry[0] == "span":
                named.append((entry[0], _name(entry[1]), entry[2], _name(entry[3]), *entry[4:]))
            elif entry[0] in ("exit", "drop"):
                named.append((entry[0], _name(entry[1]), *entry[2:]))
            else:
                named.append((*entry[:3], _name(entry[3]), *entry[4:]))
        return named

    def canonical(self) -> Any:
        """The span tree, blind to the order of concurrent siblings (see `canonical`)."""
        return canonical(self.log)


def canonical(log: list[tuple[Any, ...]]) -> Any:
    """The span tree of a `Recorder` log, blind to the order of concurrent siblings.

    Each span: its name, its own events in order, how it ended (exit or drop), and its
    child spans as a sorted multiset. Events outside any span are kept in order. A detailed
    log's details come along (a span's after its name, an event's and an end's with them).
    """
    children: dict[str | None, list[str]] = {None: []}
    events: dict[str | None, list[Any]] = {None: []}
    opened: dict[str, tuple[Any, ...]] = {}
    ends: dict[str, Any] = {}
    for entry in log:
        if entry[0] == "span":
            children.setdefault(entry[3] if entry[3] in children else None, []).append(entry[1])
            children[entry[1]], events[entry[1]], opened[entry[1]] = [], [], entry[4:]
        elif entry[0] == "exit":
            ends[entry[1]] = ("exit", *entry[2:]) if len(entry) > 2 else "exit"
        elif entry[0] == "drop":
            ends[entry[1]] = ("drop", *entry[2:])
        else:
            event = (entry[1], *entry[4:]) if len(entry) > 4 else entry[1]
            events[entry[3] if entry[3] in events else None].append(event)

    def node(span: str) -> Any:
        subtree = sorted((node(c) for c in children[span]), key=repr)
        return (_name(span), *opened[span], tuple(events[span]), ends.get(span), tuple(subtree))

    return tuple(events[None]), tuple(sorted((node(c) for c in children[None]), key=repr))
