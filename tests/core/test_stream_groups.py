"""Stream groups (partial decodes): events in, exact actions out; no engine, no clock."""

from __future__ import annotations

import pytest

from teola_core.ir.kinds import PortSpec, PrimitiveKind
from teola_core.ir.node import DecodePart, Node
from teola_core.ir.split_units import JsonArray, Lines, SplitUnit
from teola_core.ir.types import PortType
from teola_core.scheduler.events import SchedulerError
from teola_core.scheduler.streams import (
    PartDispatched,
    PartDone,
    PartFailed,
    QueryEnded,
    StartStream,
    StreamClosed,
    StreamDelta,
    StreamFailed,
    StreamGroups,
    StreamOpened,
)


def parts(count: int = 3, unit: SplitUnit | None = None) -> list[Node]:
    """A group's partial decodes; the last one also hands on the whole text."""
    nodes = []
    for i in range(count):
        outputs = [PortSpec("items", PortType.ITEMS)]
        if i == count - 1:
            outputs.append(PortSpec("text", PortType.TEXT))
        nodes.append(
            Node(
                f"d/p{i}",
                PrimitiveKind.PARTIAL_DECODE,
                (PortSpec("kv", PortType.KV),),
                tuple(outputs),
                engine="llm",
                config={"split_unit": unit or Lines()},
                part=DecodePart("d", i, count),
            )
        )
    return nodes


def done(node: Node, items: list[str], now: float, text: str | None = None, started: float = 1.0) -> PartDone:
    outputs: dict[str, object] = {"items": items}
    if text is not None:
        outputs["text"] = text
    return PartDone(query_id="q", node=node, outputs=outputs, started=started, now=now)


def test_the_first_dispatched_part_starts_the_stream_and_parts_complete_as_items_come() -> None:
    p0, p1, p2 = parts()
    sg = StreamGroups()
    assert sg.handle(PartDispatched(query_id="q", node=p0, now=0.0)) == [StartStream(query_id="q", node=p0)]
    assert sg.handle(PartDispatched(query_id="q", node=p1, now=0.1)) == []  # the stream is already queued
    assert sg.handle(StreamOpened(query_id="q", group="d", now=1.0)) == []
    assert sg.handle(StreamDelta(query_id="q", group="d", text="alpha\nbe", now=2.0)) == [done(p0, ["alpha"], 2.0)]
    assert sg.handle(StreamDelta(query_id="q", group="d", text="ta\n", now=3.0)) == [done(p1, ["beta"], 3.0)]
    # The last part waits for the end even once its first item exists: more may follow.
    assert sg.handle(PartDispatched(query_id="q", node=p2, now=3.5)) == []
    assert sg.handle(StreamDelta(query_id="q", group="d", text="gamma\ndelta", now=4.0)) == []
    assert sg.handle(StreamClosed(query_id="q", group="d", now=5.0)) == [
        done(p2, ["gamma", "delta"], 5.0, text="alpha\nbeta\ngamma\ndelta")
    ]


def test_a_part_dispatched_after_its_chunk_exists_completes_at_once() -> None:
    p0, p1, _ = parts()
    sg = StreamGroups()
    sg.handle(PartDispatched(query_id="q", node=p0, now=0.0))
    sg.handle(StreamOpened(query_id="q", group="d", now=1.0))
    sg.handle(StreamDelta(query_id="q", group="d", text="a\nb\nc", now=2.0))
    assert sg.handle(PartDispatched(query_id="q", node=p1, now=2.5)) == [done(p1, ["b"], 2.5)]


def test_fewer_items_than_parts_give_empty_chunks_at_the_end() -> None:
    p0, p1, p2 = parts()
    sg = StreamGroups()
    for p in (p0, p1, p2):
        sg.handle(PartDispatched(query_id="q", node=p, now=0.0))
    sg.handle(StreamOpened(query_id="q", group="d", now=1.0))
    assert sg.handle(StreamDelta(query_id="q", group="d", text="only", now=2.0)) == []
    assert sg.handle(StreamClosed(query_id="q", group="d", now=3.0)) == [
        done(p0, ["only"], 3.0),
        done(p1, [], 3.0),
        done(p2, [], 3.0, text="only"),
    ]


def test_a_failed_stream_fails_every_part_and_late_events_change_nothing() -> None:
    p0, p1, p2 = parts()
    sg = StreamGroups()
    for p in (p0, p1):
        sg.handle(PartDispatched(query_id="q", node=p, now=0.0))
    sg.handle(StreamOpened(query_id="q", group="d", now=1.0))
    lost = ConnectionError("stream lost")
    assert sg.handle(StreamFailed(query_id="q", group="d", error=lost, now=2.0)) == [
        PartFailed(query_id="q", node=p0, error=lost, started=1.0, now=2.0),
        PartFailed(query_id="q", node=p1, error=lost, started=1.0, now=2.0),
    ]
    assert sg.handle(StreamDelta(query_id="q", group="d", text="x\n", now=3.0)) == []
    assert sg.handle(PartDispatched(query_id="q", node=p2, now=4.0)) == [
        PartFailed(query_id="q", node=p2, error=lost, started=1.0, now=4.0)
    ]


def test_a_parser_error_at_close_fails_the_group() -> None:
    (p0, p1) = parts(2, JsonArray())
    sg = StreamGroups()
    sg.handle(PartDispatched(query_id="q", node=p0, now=0.0))
    sg.handle(PartDispatched(query_id="q", node=p1, now=0.0))
    sg.handle(StreamOpened(query_id="q", group="d", now=1.0))
    assert sg.handle(StreamDelta(query_id="q", group="d", text='["a", ', now=2.0)) == [done(p0, ["a"], 2.0)]
    [failed] = sg.handle(StreamClosed(query_id="q", group="d", now=3.0))
    assert isinstance(failed, PartFailed) and failed.node is p1


def test_groups_are_per_query_and_forgotten_when_the_query_ends() -> None:
    (p0, p1) = parts(2)
    sg = StreamGroups()
    assert sg.handle(PartDispatched(query_id="a", node=p0, now=0.0)) == [StartStream(query_id="a", node=p0)]
    assert sg.handle(PartDispatched(query_id="b", node=p1, now=0.0)) == [StartStream(query_id="b", node=p1)]
    assert len(sg) == 2
    sg.handle(QueryEnded(query_id="a"))
    assert len(sg) == 1
    assert sg.handle(StreamOpened(query_id="a", group="d", now=1.0)) == []  # late: dropped


def test_a_partial_decode_without_its_part_is_refused() -> None:
    (p0,) = parts(1)
    bare = Node("x", PrimitiveKind.PARTIAL_DECODE, p0.inputs, p0.outputs, engine="llm", config=p0.config)
    with pytest.raises(SchedulerError, match="without its DecodePart"):
        StreamGroups().handle(PartDispatched(query_id="q", node=bare, now=0.0))


def test_decode_part_chunks_concatenate_to_the_parsed_list() -> None:
    items = ["a", "b", "c", "d"]
    for count in range(1, 6):
        chunks = [DecodePart("g", i, count).chunk(items) for i in range(count)]
        assert [x for c in chunks for x in c] == items
    assert DecodePart("g", 0, 2).ready(1) and not DecodePart("g", 1, 2).ready(9)
    with pytest.raises(ValueError, match="out of range"):
        DecodePart("g", 3, 3)
