"""Stage decomposition: oversized batches become pipelined stages joined by an aggregate."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from toy_engines import meb_profile, toy_engines

from teola_core.ir.builder import GraphBuilder
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import MergeMode, PrimitiveKind
from teola_core.ir.node import ControlEdge, DataEdge, ItemSlice
from teola_core.ir.split_units import Lines
from teola_core.ir.types import Document, PortType
from teola_core.ir.validate import validate
from teola_core.passes import PassContext, StageDecomposition
from teola_core.passes.replication import compose
from teola_core.runtime.reference import evaluate

K = PrimitiveKind


def _ctx(**meb: dict[str, int]) -> PassContext:
    return PassContext(profiles={engine: meb_profile(engine, **ops) for engine, ops in meb.items()})


def _indexing(n_docs: int = 10, select: slice | None = None) -> Graph:
    """docs -> embed -> ingest -> search(question's vector) -> output."""
    b = GraphBuilder("stages")
    question = b.input("question", PortType.TEXT)
    docs = b.input("docs", PortType.TEXTS)
    texts = docs[select] if select is not None else docs
    vectors = b.embed(texts, engine="embedder", items=n_docs)
    index = b.ingest(texts, vectors, engine="vectordb", items=n_docs, collection="c")
    wrapped = b.call(lambda question: [question], {"question": question}, name="wrap", inline=True)
    qv = b.embed(wrapped, engine="embedder", items=1)
    hits = b.search(qv, index, engine="vectordb", top_k=3, items=1)
    b.output(hits=hits)
    return b.build(chain_modules=False)


def _run(graph: Graph, inputs: dict[str, Any]) -> dict[str, Any]:
    return asyncio.run(evaluate(graph, inputs, toy_engines()))


DOCS = {"question": "where is the river", "docs": [f"passage {i} about stone {i % 3}" for i in range(12)]}


def test_embed_split_at_max_efficient_batch_and_ingest_replicated() -> None:
    g = _indexing()
    out = StageDecomposition().run(g, _ctx(embedder={"embed": 4}))
    assert [(n.id, n.kind, n.items) for n in out.nodes.values()] == [
        ("input.question", K.INPUT, None),
        ("input.docs", K.INPUT, None),
        ("wrap", K.CALL, None),
        ("embed#1", K.EMBED, 1),
        ("search", K.SEARCH, 1),
        ("output", K.OUTPUT, None),
        ("embed/s0", K.EMBED, 4),
        ("embed/s1", K.EMBED, 4),
        ("embed/s2", K.EMBED, 2),
        ("ingest/s0", K.INGEST, 4),
        ("ingest/s1", K.INGEST, 4),
        ("ingest/s2", K.INGEST, 2),
        ("ingest/agg", K.AGGREGATE, None),
    ]
    s = [ItemSlice(0, 4), ItemSlice(4, 8), ItemSlice(8, None)]
    expected = {
        DataEdge("input.question", "value", "wrap", "question"),
        DataEdge("wrap", "value", "embed#1", "texts"),
        DataEdge("embed#1", "vectors", "search", "vectors"),
        DataEdge("ingest/agg", "value", "search", "index"),
        DataEdge("search", "hits", "output", "hits"),
    }
    for i in range(3):
        expected |= {
            DataEdge("input.docs", "value", f"embed/s{i}", "texts", s[i]),
            DataEdge("input.docs", "value", f"ingest/s{i}", "texts", s[i]),
            DataEdge(f"embed/s{i}", "vectors", f"ingest/s{i}", "vectors"),
            DataEdge(f"ingest/s{i}", "index", "ingest/agg", f"part_{i}"),
        }
    assert set(out.data_edges) == expected
    agg = out.nodes["ingest/agg"]
    assert dict(agg.config) == {"mode": MergeMode.BARRIER}
    assert [p.name for p in agg.inputs] == ["part_0", "part_1", "part_2"]
    # stages keep everything of the original but id and items
    original = g.nodes["ingest"]
    for i in range(3):
        stage = out.nodes[f"ingest/s{i}"]
        assert dict(stage.config) == {"collection": "c"}
        assert (stage.engine, stage.caps, stage.module, stage.label) == (
            original.engine,
            original.caps,
            original.module,
            original.label,
        )
    assert out.notes == (
        "stage-decomposition: split embed (embed on embedder) (10 items, max efficient batch 4) into 3 stages, "
        "ingest x3; joined by ingest/agg",
    )
    validate(out)
    assert _run(out, DOCS) == _run(g, DOCS)


def test_split_is_idempotent_and_a_no_op_returns_the_same_graph() -> None:
    ctx = _ctx(embedder={"embed": 4}, vectordb={"ingest": 2, "search": 2})
    once = StageDecomposition().run(_indexing(), ctx)
    assert StageDecomposition().run(once, ctx) is once
    g = _indexing()
    assert StageDecomposition().run(g, PassContext()) is g  # no profiles: no meb known
    assert StageDecomposition().run(g, _ctx(embedder={"embed": 10})) is g  # fits in one batch
    assert StageDecomposition().run(g, _ctx(embedder={"search": 1})) is g  # no embed curve


def test_replica_with_a_smaller_batch_is_cut_again_within_one_run() -> None:
    g = _indexing()
    out = StageDecomposition().run(g, _ctx(embedder={"embed": 4}, vectordb={"ingest": 2}))
    ingest_stages = sorted(n.id for n in out.nodes.values() if n.kind == K.INGEST)
    assert ingest_stages == ["ingest/s0/s0", "ingest/s0/s1", "ingest/s1/s0", "ingest/s1/s1", "ingest/s2"]
    assert all(n.items is not None and n.items <= 2 for n in out.nodes.values() if n.kind == K.INGEST)
    edges = set(out.data_edges)
    assert DataEdge("input.docs", "value", "ingest/s1/s1", "texts", ItemSlice(6, 8)) in edges
    assert DataEdge("embed/s1", "vectors", "ingest/s1/s1", "vectors", ItemSlice(2, None)) in edges
    assert DataEdge("ingest/s1/agg", "value", "ingest/agg", "part_1") in edges
    assert _run(out, DOCS) == _run(g, DOCS)


def test_existing_select_composes_with_the_stage_slice() -> None:
    g = _indexing(n_docs=10, select=slice(2, 12))
    out = StageDecomposition().run(g, _ctx(embedder={"embed": 4}))
    slices = {e.dst: e.select for e in out.data_edges if e.src == "input.docs" and e.dst.startswith("embed/")}
    assert slices == {"embed/s0": ItemSlice(2, 6), "embed/s1": ItemSlice(6, 10), "embed/s2": ItemSlice(10, 12)}
    assert _run(out, DOCS) == _run(g, DOCS)


def test_more_items_at_run_time_than_declared_are_not_lost() -> None:
    g = _indexing(n_docs=5)  # 12 documents arrive
    out = StageDecomposition().run(g, _ctx(embedder={"embed": 2}))
    assert _run(out, DOCS) == _run(g, DOCS)


def _rerank_graph(items: int = 6, top_k: int = 3) -> Graph:
    b = GraphBuilder("rerank")
    q = b.input("q", PortType.TEXT)
    docs = b.input("docs", PortType.DOCS)
    ranked = b.rerank(q, docs, engine="reranker", top_k=top_k, items=items, model="toy")
    b.output(ranked=ranked)
    return b.build()


def test_rerank_stages_keep_top_k_and_merge_by_top_k() -> None:
    g = _rerank_graph(items=8)  # two full stages cost what one batch does: a tie splits
    out = StageDecomposition().run(g, _ctx(reranker={"rerank": 4}))
    assert [n.id for n in out.nodes.values()] == [
        "input.q",
        "input.docs",
        "output",
        "rerank/s0",
        "rerank/s1",
        "rerank/agg",
    ]
    for i in range(2):
        assert dict(out.nodes[f"rerank/s{i}"].config) == {"top_k": 3, "model": "toy"}
        assert DataEdge("input.q", "value", f"rerank/s{i}", "query") in out.data_edges  # non-item input: whole
    assert dict(out.nodes["rerank/agg"].config) == {"mode": MergeMode.TOPK, "top_k": 3}
    assert DataEdge("rerank/agg", "value", "output", "ranked") in out.data_edges
    # the toy scores tie often: the merged order must still be the unsplit one
    inputs = {"q": "which", "docs": [Document(f"d{i}", f"text {i}") for i in range(9)]}
    assert _run(out, inputs) == _run(g, inputs)


def test_control_edges_reach_every_stage() -> None:
    b = GraphBuilder("guarded")
    q = b.input("q", PortType.TEXT)
    docs = b.input("docs", PortType.TEXTS)
    cond = b.condition(q, lambda v: 0 if "keep" in v else 1, branches=2)
    with b.branch(cond, 0):
        vectors = b.embed(docs, engine="embedder", items=4)
    marker = b.call(lambda q: q, {"q": q}, name="marker", inline=True)
    b.after(marker, vectors)
    b.after(vectors, b.call(lambda q: q, {"q": q}, name="later", inline=True))
    b.output(v=vectors)
    g = b.build()
    out = StageDecomposition().run(g, _ctx(embedder={"embed": 2}))
    assert set(out.control_edges) == {
        ControlEdge("condition", "embed/s0", branch=0),
        ControlEdge("condition", "embed/s1", branch=0),
        ControlEdge("marker", "embed/s0", pinned=True),
        ControlEdge("marker", "embed/s1", pinned=True),
        ControlEdge("embed/s0", "later", pinned=True),
        ControlEdge("embed/s1", "later", pinned=True),
    }
    for q in ("keep it", "drop it"):
        inputs = {"q": q, "docs": ["a", "b", "c", "d"]}
        assert _run(out, inputs) == _run(g, inputs)


def test_decode_is_never_split_here() -> None:
    b = GraphBuilder("llm")
    p = b.format("list {n}", n=b.input("n"))
    out = b.llm(p, engine="llm", max_tokens=8, split_unit=Lines(), expected_items=6)
    b.output(items=out.items)
    g = b.build()
    assert StageDecomposition().run(g, _ctx(llm={"decode": 1, "prefill": 1})) is g


def test_non_item_consumer_of_the_split_output_gets_an_aggregate() -> None:
    b = GraphBuilder("fanout")
    docs = b.input("docs", PortType.TEXTS)
    vectors = b.embed(docs, engine="embedder", items=6)
    count = b.call(lambda obj: len(obj), {"obj": vectors}, name="count", inline=True)
    b.output(v=vectors, n=count)
    g = b.build()
    out = StageDecomposition().run(g, _ctx(embedder={"embed": 3}))
    assert DataEdge("embed/agg", "value", "count", "obj") in out.data_edges
    assert DataEdge("embed/agg", "value", "output", "v") in out.data_edges
    assert dict(out.nodes["embed/agg"].config) == {"mode": MergeMode.CONCAT}
    inputs = {"docs": list("abcdefg")}
    assert _run(out, inputs) == _run(g, inputs)


@pytest.mark.parametrize(
    ("outer", "inner", "expected"),
    [
        (None, ItemSlice(2, 4), ItemSlice(2, 4)),
        (ItemSlice(3, 10), ItemSlice(2, 4), ItemSlice(5, 7)),
        (ItemSlice(3, 10), ItemSlice(4, None), ItemSlice(7, 10)),
        (ItemSlice(3, None), ItemSlice(4, None), ItemSlice(7, None)),
        (ItemSlice(3, 5), ItemSlice(4, 8), ItemSlice(5, 5)),
        (ItemSlice(-3, -1), ItemSlice(0, 1), None),
    ],
)
def test_compose_slices(outer: ItemSlice | None, inner: ItemSlice, expected: ItemSlice | None) -> None:
    assert compose(outer, inner) == expected
    if expected is not None:
        values = list(range(12))
        once = outer.apply(values) if outer else values
        assert expected.apply(values) == inner.apply(once)


def test_a_split_that_the_profiles_say_costs_more_is_not_made() -> None:
    """Past meb the toy curve is linear, so stages of 4+2 cost 2 s against 1.5 s for one batch
    of 6; a reranker has no item-wise consumer to overlap with: one batch it stays."""
    g = _rerank_graph(items=6)
    assert StageDecomposition().run(g, _ctx(reranker={"rerank": 4})) is g


def test_a_consumer_worth_overlapping_makes_the_split_pay() -> None:
    """embed 10 items at meb 4 (stages 1+1+1 s against 2.5 s whole: 0.5 s of extra work): with
    a cheap ingest the split loses (4 + 0.5 s > 3.5 s); with a slow one it wins (6 + 0.5 < 7.5 s)."""
    cheap = StageDecomposition().run(_indexing(), _ctx(embedder={"embed": 4}, vectordb={"ingest": 64}))
    assert not any(n.id.startswith("embed/s") for n in cheap.nodes.values())
    slow = StageDecomposition().run(_indexing(), _ctx(embedder={"embed": 4}, vectordb={"ingest": 2}))
    assert {"embed/s0", "embed/s1", "embed/s2"} <= set(slow.nodes)
