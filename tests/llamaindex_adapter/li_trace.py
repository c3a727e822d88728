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
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.span.simple import SimpleSpan
from llama_index.core.instrumentation.span_handlers import BaseSpanHandler
from pydantic import PrivateAttr

_UUID = re.compile(r"-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _name(span_id: str | None) -> str | None:
    return None if span_id is None else _UUID.sub("", span_id)


class _Spans(BaseSpanHandler[SimpleSpan]):
    _log: list[tuple[Any, ...]] = PrivateAttr(default_factory=list)

    def new_span(self, id_: str, bound_args: Any, instance: Any = None, parent_span_id: str | None = None, **kw: Any):
        self._log.append(("span", id_, "parent", parent_span_id))
        return SimpleSpan(id_=id_, parent_id=parent_span_id)

    def prepare_to_exit_span(self, id_: str, bound_args: Any, instance: Any = None, result: Any = None, **kw: Any):
        self._log.append(("exit", id_))

    def prepare_to_drop_span(self, id_: str, bound_args: Any, instance: Any = None, err: Any = None, **kw: Any):
        self._log.append(("drop", id_, type(err).__name__))


class _Events(BaseEventHandler):
    _log: list[tuple[Any, ...]] = PrivateAttr(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "RecorderEvents"

    def handle(self, event: Any, **kwargs: Any) -> None:
        self._log.append(("event", event.class_name(), "in", event.span_id))


class CallbackRecorder(BaseCallbackHandler):
    """Legacy callback events, as (start|end, event type, parent event type)."""

    def __init__(self) -> None:
        super().__init__([], [])
        self.log: list[tuple[Any, ...]] = []
        self._types: dict[str, str] = {}

    def on_event_start(self, event_type: Any, payload: Any = None, event_id: str = "", parent_id: str = "", **kw: Any):
        self._types[event_id] = str(event_type)
        parent = self._types.get(parent_id, parent_id if parent_id == "root" else "another manager's event")
        self.log.append(("cb-start", str(event_type), "under", parent))
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
        """The log in order, span ids replaced by span names (for runs with no concurrency)."""
        named = []
        for entry in self.log:
            if entry[0] in ("span", "exit", "drop"):
                named.append((entry[0], _name(entry[1]), *(_name(e) if i == 1 else e for i, e in enumerate(entry[2:]))))
            else:
                named.append((*entry[:3], _name(entry[3])))
        return named

    def canonical(self) -> Any:
        """The span tree, blind to the order of concurrent siblings (see `canonical`)."""
        return canonical(self.log)


def canonical(log: list[tuple[Any, ...]]) -> Any:
    """The span tree of a `Recorder` log, blind to the order of concurrent siblings.

    Each span: its name, its own events in order, how it ended (exit or drop), and its
    child spans as a sorted multiset. Events outside any span are kept in order.
    """
    children: dict[str | None, list[str]] = {None: []}
    events: dict[str | None, list[str]] = {None: []}
    ends: dict[str, Any] = {}
    for entry in log:
        if entry[0] == "span":
            children.setdefault(entry[3] if entry[3] in children else None, []).append(entry[1])
            children[entry[1]], events[entry[1]] = [], []
        elif entry[0] == "exit":
            ends[entry[1]] = "exit"
        elif entry[0] == "drop":
            ends[entry[1]] = ("drop", entry[2])
        else:
            events[entry[3] if entry[3] in events else None].append(entry[1])

    def node(span: str) -> Any:
        subtree = sorted((node(c) for c in children[span]), key=repr)
        return (_name(span), tuple(events[span]), ends.get(span), tuple(subtree))

    return tuple(events[None]), tuple(sorted((node(c) for c in children[None]), key=repr))
