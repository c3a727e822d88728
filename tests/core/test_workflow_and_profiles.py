"""Workflow templates shape per query; profiles interpolate and find the max efficient batch."""

from __future__ import annotations

import pytest

from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.errors import GraphError
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.types import PortType
from teola_core.profiles.profile import Curve, LatencyProfile
from teola_core.workflow import Module, ModuleEnv, WorkflowTemplate


def _indexing(b: GraphBuilder, env: ModuleEnv) -> dict[str, Value]:
    docs = env["docs"]
    vectors = b.embed(docs, engine="embedder", items=len(env.query["docs"]))
    return {"index": b.ingest(docs, vectors, engine="vectordb", items=len(env.query["docs"]), collection="c")}


def _per_query(b: GraphBuilder, env: ModuleEnv) -> dict[str, Value]:
    parts = [b.call(str.upper, {"q": env["questions"][i : i + 1]}, name=f"q{i}") for i in range(env.query["n"])]
    return {"answers": b.call(lambda **kw: list(kw.values()), {f"p{i}": p for i, p in enumerate(parts)}, name="join")}


TEMPLATE = WorkflowTemplate(
    "t",
    inputs={"docs": PortType.TEXTS, "questions": PortType.TEXTS, "n": PortType.ANY},
    modules=[Module("indexing", _indexing), Module("answer", _per_query)],
    outputs=("index", "answers"),
)


def test_graph_shape_depends_on_the_query() -> None:
    small = TEMPLATE.instantiate({"docs": ["a"] * 3, "questions": ["x"], "n": 1})
    large = TEMPLATE.instantiate({"docs": ["a"] * 40, "questions": ["x", "y", "z"], "n": 3})
    assert small.nodes["indexing.embed"].items == 3 and large.nodes["indexing.embed"].items == 40
    calls = [n for n in large.nodes.values() if n.kind == PrimitiveKind.CALL]
    assert len(calls) == 4 and len([n for n in small.nodes.values() if n.kind == PrimitiveKind.CALL]) == 2
    assert small.nodes["input.docs"].items == 3


def test_missing_and_unknown_query_fields_are_named() -> None:
    with pytest.raises(GraphError, match=r"missing input field\(s\) \['n'\]"):
        TEMPLATE.instantiate({"docs": [], "questions": []})
    with pytest.raises(GraphError, match=r"unknown query field\(s\) \['extra'\]"):
        TEMPLATE.instantiate({"docs": [], "questions": [], "n": 0, "extra": 1})


def test_curve_interpolates_and_extrapolates() -> None:
    c = Curve(((1, 0.1), (4, 0.15), (16, 0.45)))
    assert c.latency(4) == pytest.approx(0.15)
    assert c.latency(10) == pytest.approx(0.30)
    assert c.latency(28) == pytest.approx(0.75)  # slope of the last segment
    assert c.latency(0.5) == pytest.approx(0.1)


def test_max_efficient_batch_is_where_throughput_stops_growing() -> None:
    # DESIGN.md: 48 chunks at batch 4 -> 1.8 s (0.15 s/batch), at batch 16 -> 1.35 s (0.45 s/batch).
    p = LatencyProfile("embedder", {"embed": Curve(((1, 0.1), (4, 0.15), (16, 0.45), (32, 0.9), (64, 1.8)))})
    assert p.max_efficient_batch("embed") == 16
    # MiniLM measured here: 1 -> 10 ms, 16 -> 36 ms, 64 -> 134 ms.
    minilm = LatencyProfile("minilm", {"embed": Curve(((1, 0.010), (16, 0.036), (64, 0.134)))})
    assert minilm.max_efficient_batch("embed") == 16


def test_profile_round_trips_through_a_file(tmp_path) -> None:
    p = LatencyProfile("llm", {"prefill": Curve(((1, 0.01), (512, 0.2))), "decode": Curve(((1, 0.03), (32, 0.04)))})
    path = tmp_path / "llm.json"
    p.save(path)
    loaded = LatencyProfile.load(path)
    assert loaded == p
    assert loaded.scaled(0.5).latency("decode", 1) == pytest.approx(0.015)


def test_unknown_curve_is_named() -> None:
    with pytest.raises(KeyError, match="engine 'x' has no curve 'search'"):
        LatencyProfile("x", {}).latency("search", 1)
