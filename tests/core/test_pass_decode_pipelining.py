"""Decode pipelining: a list-producing decode streams its items into per-item consumers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from toy_engines import item_count, toy_engines

from teola_core.ir.builder import GraphBuilder
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import Capabilities, MergeMode, PortSpec, PrimitiveKind
from teola_core.ir.node import ControlEdge, DataEdge, DecodePart
from teola_core.ir.split_units import JsonArray, Lines, SplitUnit
from teola_core.ir.types import Document, PortType
from teola_core.passes import DecodePipelining, PassContext
from teola_core.runtime.reference import evaluate

K = PrimitiveKind
CTX = PassContext()
EXPAND = "Write search queries for: {question}"
LINES = Lines()


def _flatten(hits: list[list[Document]]) -> list[str]:
    return [d.text for per_query in hits for d in per_query]


def _expansion(expected: int | None = 3, unit: SplitUnit | None = LINES, text_used: bool = True) -> Graph:
    """question -> llm (queries) -> embed -> search(index of docs) -> flatten -> output."""
    b = GraphBuilder("expansion")
    question = b.input("question", PortType.TEXT)
    docs = b.input("docs", PortType.TEXTS)
    index = b.ingest(docs, b.embed(docs, engine="embedder", items=6), engine="vectordb", items=6, collection="c")
    out = b.llm(
        b.format(EXPAND, question=question),
        engine="llm",
        max_tokens=32,
        split_unit=unit,
        expected_items=expected,
        name="expand",
    )
    items = out.items or b.call(lambda text: text.splitlines(), {"text": out.text}, name="split", inline=True)
    vectors = b.embed(items, engine="embedder", items=expected)
    hits = b.search(vectors, index, engine="vectordb", top_k=2, items=expected)
    found = b.call(_flatten, {"hits": hits}, name="flatten", inline=True)
    outputs = {"found": found, "queries": items}
    if text_used:
        outputs["raw"] = out.text
    b.output(**outputs)
    return b.build()


def _run(graph: Graph, question: str) -> dict[str, Any]:
    inputs = {"question": question, "docs": [f"doc {i} on topic {i % 4}" for i in range(6)]}
    return asyncio.run(evaluate(graph, inputs, toy_engines()))


# questions whose toy expansions have 0..4 items (fewer, as many as and more than expected)
QUESTIONS = {item_count(EXPAND.format(question=q)): q for q in (f"question number {i}" for i in range(60))}


def test_item_counts_of_the_toy_llm_cover_fewer_and_more_than_expected() -> None:
    assert sorted(QUESTIONS) == [0, 1, 2, 3, 4]


def test_decode_becomes_partial_decodes_with_replicated_consumers() -> None:
    g = _expansion()
    out = DecodePipelining().run(g, CTX)
    decode = g.nodes["expand.decode"]
    parts = [out.nodes[f"expand.decode/p{i}"] for i in range(3)]
    for i, part in enumerate(parts):
        assert part.kind == K.PARTIAL_DECODE and part.engine == "llm"
        assert dict(part.config) == dict(decode.config) and part.part == DecodePart("expand.decode", i, 3)
        assert part.caps == Capabilities(batchable=True)
        assert DataEdge("expand.prefill", "kv", part.id, "kv") in out.data_edges
    assert [p.outputs for p in parts] == [
        (PortSpec("items", PortType.ITEMS),),
        (PortSpec("items", PortType.ITEMS),),
        (PortSpec("items", PortType.ITEMS), PortSpec("text", PortType.TEXT)),
    ]
    assert set(out.control_edges) == {
        ControlEdge("expand.decode/p0", "expand.decode/p1", pinned=True),
        ControlEdge("expand.decode/p1", "expand.decode/p2", pinned=True),
    }
    for i in range(3):
        assert out.nodes[f"embed#1/p{i}"].items == 1 and out.nodes[f"search/p{i}"].items == 1
        assert dict(out.nodes[f"search/p{i}"].config) == {"top_k": 2}
    new_edges = set(out.data_edges) - set(g.data_edges)
    expected = {
        DataEdge("expand.decode/p2", "text", "output", "raw"),
        DataEdge("expand.decode/agg", "value", "output", "queries"),
        DataEdge("search/agg", "value", "flatten", "hits"),
    }
    for i in range(3):
        expected |= {
            DataEdge("expand.prefill", "kv", f"expand.decode/p{i}", "kv"),
            DataEdge(f"expand.decode/p{i}", "items", f"embed#1/p{i}", "texts"),
            DataEdge(f"embed#1/p{i}", "vectors", f"search/p{i}", "vectors"),
            DataEdge("ingest", "index", f"search/p{i}", "index"),
            DataEdge(f"search/p{i}", "hits", "search/agg", f"part_{i}"),
            DataEdge(f"expand.decode/p{i}", "items", "expand.decode/agg", f"part_{i}"),
        }
    assert new_edges == expected
    assert dict(out.nodes["search/agg"].config) == {"mode": MergeMode.CONCAT}
    assert dict(out.nodes["expand.decode/agg"].config) == {"mode": MergeMode.CONCAT}
    assert not {"expand.decode", "embed#1", "search"} & set(out.nodes)
    assert out.notes == (
        "decode-pipelining: expand.decode (decode on llm) streams 3 expected items as partial decodes, "
        "embed#1 x3, search x3; joined by expand.decode/agg, search/agg",
    )


@pytest.mark.parametrize("n_items", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("unit", [Lines(), JsonArray()], ids=["lines", "json"])
def test_outputs_are_unchanged_whatever_the_model_produced(n_items: int, unit: SplitUnit) -> None:
    g = _expansion(unit=unit)
    out = DecodePipelining().run(g, CTX)
    assert out is not g
    result = _run(out, QUESTIONS[n_items])
    assert result == _run(g, QUESTIONS[n_items])
    assert len(result["queries"]) == n_items


def test_the_last_partial_decode_always_declares_text() -> None:
    out = DecodePipelining().run(_expansion(expected=2, text_used=False), CTX)
    assert out.nodes["expand.decode/p1"].output_port("text") is not None
    assert out.nodes["expand.decode/p0"].output_port("text") is None


@pytest.mark.parametrize(
    "graph",
    [_expansion(expected=1), _expansion(expected=None), _expansion(unit=None)],
    ids=["one-item", "no-expectation", "no-split-unit"],
)
def test_nothing_to_pipeline_returns_the_same_graph(graph: Graph) -> None:
    assert DecodePipelining().run(graph, CTX) is graph


def test_pipelining_is_idempotent() -> None:
    once = DecodePipelining().run(_expansion(), CTX)
    assert DecodePipelining().run(once, CTX) is once


def _items_into_ingest(aligned: bool) -> Graph:
    """decode items -> ingest(texts=items, vectors=embed(items or other texts)) -> search."""
    b = GraphBuilder("ingest")
    q = b.input("question", PortType.TEXT)
    other = b.input("other", PortType.TEXTS)
    out = b.llm(b.format(EXPAND, question=q), engine="llm", max_tokens=32, split_unit=Lines(), expected_items=2)
    assert out.items is not None
    vectors = b.embed(out.items if aligned else other, engine="embedder", items=2)
    index = b.ingest(out.items, vectors, engine="vectordb", items=2, collection="gen")
    qv = b.embed(b.call(lambda question: [question], {"question": q}, name="wrap", inline=True), engine="embedder")
    b.output(hits=b.search(qv, index, engine="vectordb", top_k=3, items=1))
    return b.build()


def test_consumers_aligned_on_the_same_parts_are_replicated_together() -> None:
    g = _items_into_ingest(aligned=True)
    out = DecodePipelining().run(g, CTX)
    assert DataEdge("llm.decode/p1", "items", "ingest/p1", "texts") in out.data_edges
    assert DataEdge("embed/p1", "vectors", "ingest/p1", "vectors") in out.data_edges
    assert dict(out.nodes["ingest/agg"].config) == {"mode": MergeMode.BARRIER}
    assert DataEdge("ingest/agg", "value", "search", "index") in out.data_edges
    for n in (0, 1, 3):
        question = next(q for q in (f"q{i}" for i in range(50)) if item_count(EXPAND.format(question=q)) == n)
        inputs = {"question": question, "other": []}
        assert asyncio.run(evaluate(out, inputs, toy_engines())) == asyncio.run(evaluate(g, inputs, toy_engines()))


def test_a_consumer_needing_a_slice_of_another_input_is_not_replicated() -> None:
    g = _items_into_ingest(aligned=False)
    out = DecodePipelining().run(g, CTX)
    assert "ingest" in out.nodes  # its vectors would need a run-time slice
    assert DataEdge("llm.decode/agg", "value", "ingest", "texts") in out.data_edges
