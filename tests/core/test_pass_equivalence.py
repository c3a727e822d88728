"""Property: the passes never change what a graph computes.

Random small RAG-like graphs (document and query counts, expected list lengths, max
efficient batches, prompt templates with or without an early prefix, an optional
condition) are optimized by the full pipeline; the reference evaluator must give the
same outputs for the p-graph and the e-graph on the deterministic toy engines.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toy_engines import meb_profile, toy_engines

from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import MergeMode, PrimitiveKind
from teola_core.ir.split_units import JsonArray, Lines
from teola_core.ir.types import Document, PortType, Scored
from teola_core.passes import PassContext, PassManager
from teola_core.runtime.reference import evaluate

TEMPLATES = (
    "Answer briefly. Q: {question} C: {context}",
    "{context} Q: {question}",
    "Note: {note} Q: {question} C: {context} End.",
    "C: {context} Note: {note}",
)


@dataclass(frozen=True)
class Case:
    declared_docs: int
    actual_docs: int
    expand: bool  # queries from an LLM (decode pipelining) or a call
    queries: int  # expected/declared query count
    json_queries: bool
    rerank_top_k: int | None  # None: no rerank
    condition: bool
    template: str
    answer_items: int | None  # the answer is a list too
    mebs: tuple[int, int, int, int]  # embed, ingest, search, rerank
    question: str
    rerank_seconds: float = 2.0  # 0.25: pre-scoring every ingested text fits under embed + ingest


def _flatten(hits: list[list[Document]]) -> list[Document]:
    return [d for per_query in hits for d in per_query]


def _context(docs: list[Any]) -> str:
    return " | ".join(d.doc.text if isinstance(d, Scored) else d.text for d in docs)


def build(case: Case) -> Graph:
    b = GraphBuilder("random_rag")
    question = b.input("question", PortType.TEXT)
    docs = b.input("docs", PortType.TEXTS)
    with b.module("indexing"):
        vectors = b.embed(docs, engine="embedder", items=case.declared_docs)
        index = b.ingest(docs, vectors, engine="vectordb", items=case.declared_docs, collection="docs")
    with b.module("queries"):
        if case.expand:
            unit = JsonArray() if case.json_queries else Lines()
            prompt = b.format("Write queries for: {question}", question=question)
            out = b.llm(
                prompt, engine="llm", max_tokens=16, split_unit=unit, expected_items=case.queries, name="expand"
            )
            assert out.items is not None
            queries: Value = out.items
        else:
            n = case.queries
            queries = b.call(lambda question: [f"{question} #{i}" for i in range(n)], {"question": question}, name="qs")
    with b.module("retrieval"):
        qv = b.embed(queries, engine="embedder", items=case.queries)
        hits = b.search(qv, index, engine="vectordb", top_k=2, items=case.queries)
        candidates = b.call(_flatten, {"hits": hits}, name="flatten", inline=True)
    with b.module("rank"):
        if case.rerank_top_k is None:
            ranked = candidates
        elif case.condition:
            cond = b.condition(question, lambda q: len(q) % 2, branches=2)
            with b.branch(cond, 0):
                reranked = b.rerank(
                    question, candidates, engine="reranker", top_k=case.rerank_top_k, items=2 * case.queries
                )
            with b.branch(cond, 1):
                first = b.call(lambda docs: docs[:1], {"docs": candidates}, name="first", inline=True)
            ranked = b.aggregate([reranked, first], MergeMode.SELECT)
        else:
            ranked = b.rerank(question, candidates, engine="reranker", top_k=case.rerank_top_k, items=2 * case.queries)
    with b.module("synthesis"):
        context = b.call(_context, {"docs": ranked}, name="context", inline=True)
        variables = {"question": question, "context": context}
        if "{note}" in case.template:
            variables["note"] = b.call(lambda question: question.upper(), {"question": question}, name="note")
        prompt = b.format(case.template, **{k: v for k, v in variables.items() if "{" + k + "}" in case.template})
        answer = b.llm(
            prompt,
            engine="llm",
            max_tokens=24,
            split_unit=Lines() if case.answer_items else None,
            expected_items=case.answer_items,
            name="answer",
        )
    outputs = {"answer": answer.text, "ranked": ranked}
    if answer.items is not None:
        outputs["points"] = b.call(lambda items: [s.upper() for s in items], {"items": answer.items}, name="points")
    b.output(**outputs)
    return b.build()


def context_for(case: Case) -> PassContext:
    embed, ingest, search, rerank = case.mebs
    return PassContext(
        profiles={
            "embedder": meb_profile("embedder", embed=embed),
            "vectordb": meb_profile("vectordb", seconds=0.5, ingest=ingest, search=search),
            "reranker": meb_profile("reranker", seconds=case.rerank_seconds, rerank=rerank),
            "llm": meb_profile("llm", seconds=0.1, prefill=1, decode=8),  # per-token prefill: early pays
        }
    )


MEB = st.sampled_from([1, 2, 3, 4, 16])


@st.composite
def cases(draw: st.DrawFn) -> Case:
    declared = draw(st.integers(1, 10))
    return Case(
        declared_docs=declared,
        actual_docs=max(0, declared + draw(st.integers(-2, 2))),
        expand=draw(st.booleans()),
        queries=draw(st.integers(1, 4)),
        json_queries=draw(st.booleans()),
        rerank_top_k=draw(st.one_of(st.none(), st.integers(1, 4))),
        condition=draw(st.booleans()),
        template=draw(st.sampled_from(TEMPLATES)),
        answer_items=draw(st.one_of(st.none(), st.integers(2, 3))),
        mebs=(draw(MEB), draw(MEB), draw(MEB), draw(MEB)),
        question=f"question {draw(st.integers(0, 10_000))}",
        rerank_seconds=draw(st.sampled_from([0.25, 2.0])),
    )


def _evaluate(graph: Graph, case: Case) -> dict[str, Any]:
    docs = [f"passage {i} on {case.question.split()[-1]} topic {i % 3}" for i in range(case.actual_docs)]
    return asyncio.run(evaluate(graph, {"question": case.question, "docs": docs}, toy_engines()))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_optimized_graph_computes_the_same_outputs(case: Case) -> None:
    p_graph = build(case)
    ctx = context_for(case)
    result = PassManager().optimize(p_graph, ctx)
    assert _evaluate(result.e_graph, case) == _evaluate(p_graph, case)
    assert PassManager().optimize(result.e_graph, ctx).e_graph is result.e_graph


def test_every_pass_applies_on_a_representative_graph() -> None:
    """The property above is not vacuous: on this case every pass rewrites something."""
    case = Case(
        declared_docs=8,
        actual_docs=9,
        expand=True,
        queries=3,
        json_queries=False,
        rerank_top_k=2,
        condition=True,
        template=TEMPLATES[2],
        answer_items=2,
        mebs=(4, 4, 4, 2),
        question="question 7",
    )
    p_graph = build(case)
    result = PassManager().optimize(p_graph, context_for(case))
    assert set(result.applied) == {"dependency-pruning", "stage-decomposition", "prefill-split", "decode-pipelining"}
    kinds = {n.kind for n in result.e_graph.nodes.values()}
    assert {PrimitiveKind.PARTIAL_PREFILL, PrimitiveKind.FULL_PREFILL, PrimitiveKind.PARTIAL_DECODE} <= kinds
    assert _evaluate(result.e_graph, case) == _evaluate(p_graph, case)

    unguarded = replace(case, condition=False, rerank_seconds=0.25, mebs=(4, 4, 4, 16))
    p_graph = build(unguarded)
    result = PassManager().optimize(p_graph, context_for(unguarded))
    assert "rerank-prescoring" in result.applied
    assert _evaluate(result.e_graph, unguarded) == _evaluate(p_graph, unguarded)
