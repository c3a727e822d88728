"""Partial-decode stream groups: which part starts the stream, and when each part completes.

A pure state machine (`handle(event) -> [action]`, no I/O, no clock) over the groups of
every running query. Decode pipelining turns one decode into parts (`DecodePart`) over one
stream. The first part of a group to be dispatched starts the stream (`StartStream`: the
runtime queues it as a solo stream batch holding an engine slot until the stream ends);
every dispatched part waits in its group and completes as soon as its chunk is final:
part i once item i is parsed (i < count-1), the last part, and any part that hands on
the whole text, at the end of the stream. A part dispatched after its chunk exists
completes at once.

    sg = StreamGroups()
    [start] = sg.handle(PartDispatched(query_id="q", node=p0, now=0.0))   # StartStream(p0)
    sg.handle(StreamOpened(query_id="q", group=g, now=1.0))
    sg.handle(StreamDelta(query_id="q", group=g, text="alpha\\nbe", now=2.0))  # [PartDone(p0)]
    sg.handle(StreamClosed(query_id="q", group=g, now=3.0))                    # the rest

Groups: (query, group) -> its parser (from the starting part's split unit), the items
parsed, the text so far, whether it opened, ended or failed, and its waiting parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from teola_core.ir.node import DecodePart, Node
from teola_core.scheduler.events import SchedulerError


# -- events ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class PartDispatched:
    """The graph scheduler dispatched a partial decode."""

    query_id: str
    node: Node
    now: float


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamOpened:
    """The group's stream batch began (its start is every part's start)."""

    query_id: str
    group: str
    now: float


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamDelta:
    """The engine streamed more text."""

    query_id: str
    group: str
    text: str
    now: float


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamClosed:
    """The stream ended normally. `output`: the decode's whole output when the engine gave
    one (`StreamResult`), handed on as "text" instead of the deltas joined."""

    query_id: str
    group: str
    now: float
    output: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamFailed:
    """The stream raised (or timed out): every part of the group fails with `error`."""

    query_id: str
    group: str
    error: BaseException
    now: float


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryEnded:
    """The query ended (done, failed or cancelled): forget its groups."""

    query_id: str


StreamEvent = PartDispatched | StreamOpened | StreamDelta | StreamClosed | StreamFailed | QueryEnded


# -- actions -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class StartStream:
    """Queue `node` as the group's stream batch (`engine.stream`)."""

    query_id: str
    node: Node


@dataclass(frozen=True, slots=True, kw_only=True)
class PartDone:
    """`node`'s chunk is final: these are its outputs. `started`: when the stream began."""

    query_id: str
    node: Node
    outputs: dict[str, Any]
    started: float
    now: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PartFailed:
    query_id: str
    node: Node
    error: BaseException
    started: float
    now: float


StreamAction = StartStream | PartDone | PartFailed


@dataclass(eq=False)
class _Group:
    parser: Any
    items: list[Any] = field(default_factory=list)
    deltas: list[str] = field(default_factory=list)
    started: float | None = None
    ended: bool = False
    error: BaseException | None = None
    waiting: list[Node] = field(default_factory=list)
    output: Any = None  # the whole output, when the engine gave one at the end


def _part(node: Node) -> DecodePart:
    if node.part is None:
        raise SchedulerError(f"{node.describe()} is a partial decode without its DecodePart")
    return node.part


class StreamGroups:
    """Every running query's partial-decode groups, keyed by (query, group)."""

    def __init__(self) -> None:
        self._groups: dict[tuple[str, str], _Group] = {}

    def __len__(self) -> int:
        return len(self._groups)

    def handle(self, event: StreamEvent) -> list[StreamAction]:
        if isinstance(event, QueryEnded):
            for key in [k for k in self._groups if k[0] == event.query_id]:
                del self._groups[key]
            return []
        if isinstance(event, PartDispatched):
            return self._dispatched(event)
        group = self._groups.get((event.query_id, event.group))
        if group is None:
            return []  # the query ended while its stream still ran: a late event
        if group.error is not None or group.ended:
            return []  # settled already: what the engine still sends changes nothing
        if isinstance(event, StreamOpened):
            group.started = event.now
        elif isinstance(event, StreamDelta):
            group.deltas.append(event.text)
            try:
                group.items.extend(group.parser.feed(event.text))
            except Exception as exc:  # a parser error fails the group, as at close
                group.error = exc
        elif isinstance(event, StreamClosed):
            try:
                group.items.extend(group.parser.close())
            except Exception as exc:  # e.g. a truncated JSON array
                group.error = exc
            group.ended = True
            group.output = event.output
        elif isinstance(event, StreamFailed):
            group.error = event.error
        else:
            raise SchedulerError(f"stream groups cannot handle {type(event).__name__}")
        return self._settle(event.query_id, group, event.now)

    def _dispatched(self, event: PartDispatched) -> list[StreamAction]:
        part = _part(event.node)
        key = (event.query_id, part.group)
        group = self._groups.get(key)
        actions: list[StreamAction] = []
        if group is None:
            group = self._groups[key] = _Group(event.node.config["split_unit"].parser())
            actions.append(StartStream(query_id=event.query_id, node=event.node))
        group.waiting.append(event.node)
        return actions + self._settle(event.query_id, group, event.now)

    def _settle(self, query_id: str, group: _Group, now: float) -> list[StreamAction]:
        """Complete the group's waiting parts whose chunk is final (or fail them all)."""
        if group.started is None:
            return []
        actions: list[StreamAction] = []
        waiting: list[Node] = []
        for node in group.waiting:
            part = _part(node)
            wants_text = node.output_port("text") is not None
            if group.error is not None:
                actions.append(
                    PartFailed(query_id=query_id, node=node, error=group.error, started=group.started, now=now)
                )
            elif group.ended or (not wants_text and part.ready(len(group.items))):
                outputs: dict[str, Any] = {"items": part.chunk(group.items)}
                if wants_text:
                    outputs["text"] = "".join(group.deltas) if group.output is None else group.output
                actions.append(PartDone(query_id=query_id, node=node, outputs=outputs, started=group.started, now=now))
            else:
                waiting.append(node)
        group.waiting = waiting
        return actions
