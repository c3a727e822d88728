"""Rerank pre-scoring: the ingested texts are scored beside their embedding, the rerank
after the search becomes a lookup, and a candidate without a score is still reranked."""

from __future__ import annotations

import asyncio
from typing import Any

from toy_engines import meb_profile, toy_engines

from teola_core.ir.builder import GraphBuilder
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.speculation import SPECULATIVE
from teola_core.ir.types import Document, PortType
from teola_core.passes import PassContext, PassManager, RerankPrescoring
from teola_core.runtime.base import PrimitiveSpan
from teola_core.runtime.local import LocalRuntime
from teola_core.runtime.reference import evaluate

DOCS = [f"passage {i} on topic {i % 3} of the question" for i in range(8)]
QUESTION = "which topic of the question"


def ctx(rerank_seconds: float = 0.5, rerank_meb: int = 16) -> PassContext:
    """A rerank takes `rerank_seconds` up to `rerank_meb` documents, then grows linearly."""
    return PassContext(
        profiles={
            "embedder": meb_profile("embedder", embed=16),
            "vectordb": meb_profile("vectordb", seconds=0.5, ingest=16, search=16),
            "reranker": meb_profile("reranker", seconds=rerank_seconds, rerank=rerank_meb),
            "llm": meb_profile("llm", seconds=5.0, prefill=16, decode=16),
        }
    )


def rag(extra: str | None = None, guarded: bool = False, candidates: int | None = None, rewrite: bool = False) -> Graph:
    """docs -> embed -> ingest; question -> embed -> search -> merge [+ one outside doc] -> rerank
    (`candidates`: the rerank's expected item count; `rewrite`: its query is a model's rewrite)."""
    b = GraphBuilder("rag")
    question = b.input("question", PortType.TEXT)
    query = b.llm(b.format("Rewrite: {q}", q=question), engine="llm", max_tokens=8).text if rewrite else question
    docs = b.input("docs", PortType.TEXTS)
    vectors = b.embed(docs, engine="embedder", items=len(DOCS))
    index = b.ingest(docs, vectors, engine="vectordb", items=len(DOCS), collection="c")
    qv = b.embed(b.call(lambda question: [question], {"question": question}, inline=True), engine="embedder", items=1)
    hits = b.search(qv, index, engine="vectordb", top_k=4, items=1)

    def merge(hits: list[list[Document]]) -> list[Document]:
        return hits[0] + ([Document("outside", extra)] if extra is not None else [])

    found = b.call(merge, {"hits": hits}, name="merge", inline=True)
    if guarded:
        cond = b.condition(question, lambda q: 1, branches=2)
        with b.branch(cond, 1):
            ranked = b.rerank(query, found, engine="reranker", top_k=3, name="rerank", items=candidates)
    else:
        ranked = b.rerank(query, found, engine="reranker", top_k=3, name="rerank", items=candidates)
    b.output(ranked=ranked)
    return b.build()


def optimize(graph: Graph, context: PassContext) -> Graph:
    return PassManager([RerankPrescoring()]).optimize(graph, context).e_graph


async def run(graph: Graph) -> tuple[dict[str, Any], list[PrimitiveSpan]]:
    spans: list[PrimitiveSpan] = []

    class Record:
        def on_span(self, span: PrimitiveSpan) -> None:
            spans.append(span)

    runtime = LocalRuntime(toy_engines())
    runtime.add_hook(Record())
    try:
        return await runtime.run(graph, {"question": QUESTION, "docs": DOCS}), spans
    finally:
        await runtime.close()


def test_the_rerank_becomes_a_lookup_of_scores_computed_beside_the_embedding() -> None:
    p_graph = rag()
    e_graph = optimize(p_graph, ctx())
    assert e_graph.nodes["rerank"].kind == PrimitiveKind.CALL  # same id: traces and consumers stay
    pre = e_graph.nodes["rerank/prescore"]
    assert pre.kind == PrimitiveKind.RERANK and pre.items == len(DOCS) and pre.config["top_k"] is None
    assert "embed" not in {e_graph.nodes[p].kind.value for p in e_graph.predecessors(pre.id)}  # it does not wait
    assert any("rerank-prescoring" in note for note in e_graph.notes)

    expected, _ = asyncio.run(run(p_graph))
    got, spans = asyncio.run(run(e_graph))
    assert got == expected
    ran = {s.node.id for s in spans}
    assert "rerank/prescore" in ran and "rerank/fallback" not in ran  # every candidate had its score


def test_a_candidate_that_was_not_ingested_is_reranked_by_the_fallback() -> None:
    p_graph = rag(extra="an outside passage on topic 1 of the question")
    e_graph = optimize(p_graph, ctx())
    expected, _ = asyncio.run(run(p_graph))
    got, spans = asyncio.run(run(e_graph))
    assert got == expected
    assert any(d.doc.id == "outside" for d in got["ranked"])  # it ranks, so its score mattered
    assert "rerank/fallback" in {s.node.id for s in spans}
    reference = asyncio.run(evaluate(e_graph, {"question": QUESTION, "docs": DOCS}, toy_engines()))
    assert reference == expected


def test_left_alone_where_it_does_not_pay_or_cannot_be_known() -> None:
    graph = rag()
    assert optimize(graph, ctx(rerank_seconds=5.0)) is graph  # scoring all would outlast embed + ingest
    assert optimize(graph, PassContext()) is graph  # no profiles: 8/4 times the rerank's work, not done blind
    shared = PassContext(profiles=ctx().profiles, devices={"embedder": "cpu", "reranker": "cpu", "vectordb": "cpu"})
    assert optimize(graph, shared) is graph  # one device: the pre-scoring would only take turns with the embedding
    guarded = rag(guarded=True)
    assert optimize(guarded, ctx()) is guarded  # inside a branch: it would run whether taken or not
    late = rag(rewrite=True)
    assert optimize(late, ctx()) is late  # its query (a model's rewrite) comes too late to score ahead


def test_the_pre_scoring_runs_in_pieces_as_small_as_their_cost_allows() -> None:
    """A rerank of 4 candidates: pieces of 4 texts where a rerank's cost is all per document
    (two pieces cost what one batch of 8 costs), one piece of all 8 where a batch costs the
    same whatever its size up to 16 (two would double the work), nothing where it cannot
    end before the candidates are known (after embed, ingest and search: 2 s)."""

    def scorers(graph: Graph) -> list[tuple[str, int | None, object]]:
        return [
            (n.id, n.items, n.config[SPECULATIVE].consumer) for n in graph.nodes.values() if SPECULATIVE in n.config
        ]

    per_document = ctx(rerank_seconds=0.1, rerank_meb=1)
    assert scorers(optimize(rag(candidates=4), per_document)) == [
        ("rerank/prescore/0", 4, "rerank/unscored"),
        ("rerank/prescore/1", 4, "rerank/unscored"),
    ]
    assert scorers(optimize(rag(candidates=4), ctx(0.5))) == [("rerank/prescore", 8, "rerank/unscored")]
    assert scorers(optimize(rag(candidates=4), ctx(rerank_seconds=0.3, rerank_meb=1))) == []
    p_graph = rag(candidates=4, extra="an outside passage on topic 1 of the question")
    expected, _ = asyncio.run(run(p_graph))
    got, spans = asyncio.run(run(optimize(p_graph, per_document)))
    assert got == expected
    assert {"rerank/prescore/0", "rerank/prescore/1", "rerank/fallback"} <= {s.node.id for s in spans}


def test_a_reranker_that_scores_its_list_as_a_whole_is_left_alone() -> None:
    """A softmax-normalised or listwise reranker declares itself not splittable: the score of a
    text depends on the others in its list, so scores of all ingested texts would differ."""
    from dataclasses import replace

    graph = rag()
    editor = graph.edit()
    rerank = graph.nodes["rerank"]
    editor.replace_node(replace(rerank, caps=replace(rerank.caps, splittable=False)))
    listwise = editor.freeze()
    assert optimize(listwise, ctx()) is listwise


def test_a_rerank_of_anything_but_searched_hits_is_left_alone() -> None:
    b = GraphBuilder("plain")
    question = b.input("question", PortType.TEXT)
    docs = b.call(lambda question: [Document("a", question)], {"question": question}, inline=True)
    b.output(ranked=b.rerank(question, docs, engine="reranker", top_k=1))
    graph = b.build()
    assert optimize(graph, ctx()) is graph


def test_the_rewrite_is_idempotent() -> None:
    e_graph = optimize(rag(), ctx())
    assert optimize(e_graph, ctx()) is e_graph
