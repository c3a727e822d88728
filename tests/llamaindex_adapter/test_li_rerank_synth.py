"""Rerankers as RERANK primitives and synthesizers as plan + FORMAT + LLM (0.12 and 0.14).

Every shape: the optimized query engine answers exactly as the original (text, source
nodes with their scores and order, metadata), sync and async, and the graph has the
primitives the shape must become.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from engine_watch import hold_batches
from li_fakes import (
    TEXTS,
    FakeCrossEncoder,
    make_chat_llm,
    make_index,
    make_llm,
    make_silent_llm,
    overlap_rerank_class,
    pair_score,
    sbert_rerank,
)
from llama_index.core import PromptTemplate
from llama_index.core.indices.prompt_helper import PromptHelper
from llama_index.core.postprocessor import SimilarityPostprocessor
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.response_synthesizers import get_response_synthesizer
from llama_index.core.schema import MetadataMode, NodeWithScore

from teola_core.ir.kinds import PrimitiveKind
from teola_core.profiles.profile import Curve, LatencyProfile
from teola_llamaindex import TeolaQueryEngine
from teola_llamaindex.rerank import LlamaIndexRerankEngine, register_batch_rerank

INDEX = make_index()
OverlapRerank = overlap_rerank_class()
QUESTIONS = ["what do cats do at dusk?", "refine mode chunk", "how do vector stores answer a query?"]
QUERY_FIRST = PromptTemplate("Query: {query_str}\nUse this context:\n{context_str}\nAnswer:")
SLOW = Curve(((1, 0.05),))
PROFILES = {
    "embed:HashEmbedding": LatencyProfile("embed:HashEmbedding", {"embed": SLOW}),
    "vectordb:VectorIndexRetriever": LatencyProfile("vectordb:VectorIndexRetriever", {"search": SLOW}),
}


def _llm() -> Any:
    return make_llm(max_tokens=None)


def _engine(*, top_k: int = 3, postprocessors: list[Any] | None = None, llm: Any = None, **synth: Any) -> Any:
    return RetrieverQueryEngine(
        retriever=INDEX.as_retriever(similarity_top_k=top_k),
        response_synthesizer=get_response_synthesizer(llm=llm or _llm(), **synth),
        node_postprocessors=postprocessors or [],
    )


def _same(a: Any, b: Any) -> None:
    assert str(a) == str(b)
    assert [(n.node.node_id, n.score) for n in a.source_nodes] == [(n.node.node_id, n.score) for n in b.source_nodes]
    assert a.metadata == b.metadata


def _check(build: Callable[[], Any], **options: Any) -> TeolaQueryEngine:
    """Optimized == original for every question, sync and async; returns the drop-in."""
    engine = build()
    fast = TeolaQueryEngine(engine, **options)
    for q in QUESTIONS:
        expected = engine.query(q)
        _same(fast.query(q), expected)
        _same(asyncio.run(fast.aquery(q)), expected)
    return fast


def _kinds(fast: TeolaQueryEngine) -> set[PrimitiveKind]:
    return {n.kind for n in fast.graph.nodes.values()}


class Kinds:
    """A runtime hook: the kinds of the primitives that ran."""

    def __init__(self) -> None:
        self.ran: list[PrimitiveKind] = []
        self.batches: list[tuple[PrimitiveKind, int]] = []

    def on_span(self, span: Any) -> None:
        self.ran.append(span.node.kind)
        self.batches.append((span.node.kind, span.batch_size))


def _ran(fast: TeolaQueryEngine, question: str) -> list[PrimitiveKind]:
    hook = Kinds()

    async def main() -> Any:
        fast.runtime().add_hook(hook)
        return await fast.aquery(question)

    asyncio.run(main())
    return hook.ran


# -- rerankers ---------------------------------------------------------------------------


def test_sentence_transformer_rerank_is_a_rerank_primitive_with_the_same_nodes_and_scores() -> None:
    rerank = sbert_rerank(top_n=2)
    fast = _check(lambda: _engine(top_k=5, postprocessors=[rerank]))
    assert PrimitiveKind.RERANK in _kinds(fast)
    engine = fast._engines.engines["rerank:SentenceTransformerRerank"]
    assert isinstance(engine, LlamaIndexRerankEngine)
    assert engine.batch is None and engine.limits.max_batch_items == 1 and engine.limits.concurrency == 1
    assert isinstance(rerank._model, FakeCrossEncoder) and rerank._model.calls  # the model itself was called
    assert set(rerank._model.calls) == {5}  # one predict per query, never a joint call


def test_rerank_then_filter_then_rerank_in_order() -> None:
    """Two rerankers around a filter: RERANK, call, RERANK, in the engine's order."""
    fast = _check(
        lambda: _engine(
            top_k=6,
            postprocessors=[
                sbert_rerank(top_n=4),
                SimilarityPostprocessor(similarity_cutoff=0.5),
                OverlapRerank(top_n=2),
            ],
        )
    )
    reranks = [n for n in fast.graph.nodes.values() if n.kind == PrimitiveKind.RERANK]
    assert sorted(n.engine for n in reranks) == ["rerank:OverlapRerank", "rerank:SentenceTransformerRerank"]
    assert not any(n.engine and "Similarity" in n.engine for n in fast.graph.nodes.values())


def test_users_own_postprocessor_is_a_rerank_primitive() -> None:
    fast = _check(lambda: _engine(top_k=4, postprocessors=[OverlapRerank(top_n=3)]))
    assert PrimitiveKind.RERANK in _ran(fast, QUESTIONS[0])
    assert fast._engines.engines["rerank:OverlapRerank"].limits.max_batch_items == 1


def test_filters_stay_calls() -> None:
    fast = _check(lambda: _engine(top_k=4, postprocessors=[SimilarityPostprocessor(similarity_cutoff=0.5)]))
    assert PrimitiveKind.RERANK not in _kinds(fast)


def test_rerank_error_is_the_users_exception() -> None:
    class Broken(OverlapRerank):  # type: ignore[misc, valid-type]
        def _postprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: Any = None) -> Any:
            raise RuntimeError("rerank broke")

    fast = TeolaQueryEngine(_engine(postprocessors=[Broken()]))
    with pytest.raises(RuntimeError, match="rerank broke") as info:
        fast.query("x")
    assert any("postprocessor0:Broken" in note for note in info.value.__notes__)
    with pytest.raises(RuntimeError, match="rerank broke"):
        asyncio.run(fast.aquery("x"))


def _joint_overlap(pp: Any, requests: list[tuple[list[NodeWithScore], Any]]) -> list[list[NodeWithScore]]:
    """One scoring pass over every request's pairs (a pure function of each pair), then
    each request's own sort and cut: what `OverlapRerank._postprocess_nodes` does per request."""
    pairs = [
        (q.query_str if q is not None else "", n.node.get_content(metadata_mode=MetadataMode.EMBED))
        for nodes, q in requests
        for n in nodes
    ]
    scores = iter([pair_score(query, text) for query, text in pairs])
    out = []
    for nodes, _ in requests:
        scored = [NodeWithScore(node=n.node, score=next(scores)) for n in nodes]
        out.append(sorted(scored, key=lambda n: -(n.score or 0.0))[: pp.top_n])
    return out


def test_registered_batch_reranker_batches_concurrent_queries_with_the_same_results() -> None:
    class JointOverlap(OverlapRerank):  # type: ignore[misc, valid-type]
        pass

    register_batch_rerank(JointOverlap, _joint_overlap)
    engine = _engine(top_k=5, postprocessors=[JointOverlap(top_n=2)])
    fast = TeolaQueryEngine(engine)
    rerank_engine = fast._engines.engines["rerank:JointOverlap"]
    assert rerank_engine.batch is _joint_overlap and rerank_engine.limits.max_batch_items is None
    questions = [f"{TEXTS[i % len(TEXTS)]} {i}" for i in range(8)]
    hook = Kinds()

    async def main() -> list[Any]:
        runtime = fast.runtime()
        runtime.add_hook(hook)
        hold_batches(runtime, rerank_engine, len(questions))  # a model call lasts until every query's is in
        return await asyncio.gather(*(fast.aquery(q) for q in questions))

    for got, q in zip(asyncio.run(main()), questions, strict=True):
        _same(got, engine.query(q))
    assert rerank_engine.joint_calls >= 1
    assert max(size for kind, size in hook.batches if kind == PrimitiveKind.RERANK) > 1


def test_register_batch_rerank_takes_postprocessor_classes_only() -> None:
    with pytest.raises(TypeError):
        register_batch_rerank(dict, _joint_overlap)


# -- synthesizers ------------------------------------------------------------------------
# By default a synthesizer is its own one call; these are the shapes `decompose=True` splits.


@pytest.mark.parametrize("mode", ["compact", "refine", "simple_summarize", "tree_summarize"])
def test_by_default_every_synthesizer_is_its_own_call(mode: str) -> None:
    fast = _check(lambda: _engine(response_mode=mode))
    assert PrimitiveKind.DECODE not in _kinds(fast) and PrimitiveKind.FORMAT not in _kinds(fast)


@pytest.mark.parametrize(
    "mode, top_k",
    [("compact", 3), ("compact", 6), ("simple_summarize", 3), ("refine", 1)],
)
def test_one_prompt_synthesizers_run_as_format_and_llm(mode: str, top_k: int) -> None:
    fast = _check(lambda: _engine(top_k=top_k, response_mode=mode), decompose=True)
    assert {PrimitiveKind.FORMAT, PrimitiveKind.PREFILL, PrimitiveKind.DECODE} <= _kinds(fast)
    assert "plan + format + llm" in fast.explain()
    assert PrimitiveKind.DECODE in _ran(fast, QUESTIONS[0])


def test_refine_chain_runs_as_the_original_synthesizer() -> None:
    fast = _check(lambda: _engine(top_k=3, response_mode="refine"), decompose=True)
    assert PrimitiveKind.DECODE not in _ran(fast, QUESTIONS[0])  # several chunks: the opaque branch


def test_compact_that_needs_several_prompts_runs_as_the_original() -> None:
    helper = PromptHelper(context_window=600, num_output=16, chunk_overlap_ratio=0.0, chunk_size_limit=30)
    # a short-answer MockLLM: a refine prompt holds the previous answer, an echo would not fit
    fast = _check(
        lambda: _engine(top_k=6, response_mode="compact", prompt_helper=helper, llm=make_llm(max_tokens=8)),
        decompose=True,
    )
    assert PrimitiveKind.DECODE not in _ran(fast, QUESTIONS[0])


def test_no_nodes_is_the_empty_response() -> None:
    def build() -> Any:
        return _engine(top_k=2, postprocessors=[SimilarityPostprocessor(similarity_cutoff=2.0)])

    fast = _check(build, decompose=True)
    assert str(fast.query("anything")) == "Empty Response"


def test_empty_answer_is_the_empty_response() -> None:
    fast = _check(lambda: _engine(llm=make_silent_llm()), decompose=True)
    assert str(fast.query("cats")) == "Empty Response"
    assert PrimitiveKind.DECODE in _ran(fast, "cats")


def test_system_prompt_and_query_wrapper_are_part_of_the_format() -> None:
    def build() -> Any:
        llm = make_llm(max_tokens=None, system_prompt="You are terse.")
        llm.query_wrapper_prompt = PromptTemplate("[INST] {query_str} [/INST]")
        return _engine(llm=llm, text_qa_template=QUERY_FIRST)

    fast = _check(build, decompose=True)
    assert PrimitiveKind.DECODE in _ran(fast, QUESTIONS[1])  # the FORMAT rendered LlamaIndex's own prompt


def test_chat_model_runs_as_one_chat_primitive() -> None:
    fast = _check(lambda: _engine(llm=make_chat_llm(max_tokens=None)), decompose=True)
    assert PrimitiveKind.FORMAT not in _kinds(fast)  # messages, no text prompt to split
    assert PrimitiveKind.DECODE in _ran(fast, QUESTIONS[0])


def test_prefill_split_prefills_the_question_before_the_nodes() -> None:
    """Query-first template: the prefix with the question is prefilled while retrieval runs."""
    fast = _check(lambda: _engine(text_qa_template=QUERY_FIRST), profiles=PROFILES, decompose=True)
    partial = [n for n in fast.graph.nodes.values() if n.kind == PrimitiveKind.PARTIAL_PREFILL]
    assert partial, fast.explain()
    prefix_format = next(
        n for n in fast.graph.nodes.values() if n.kind == PrimitiveKind.FORMAT and n.config.get("prefix_segments")
    )
    assert {p.name for p in prefix_format.inputs} == {"query_str"}
    ran = _ran(fast, QUESTIONS[0])
    assert PrimitiveKind.PARTIAL_PREFILL in ran and PrimitiveKind.DECODE in ran


def test_a_template_changed_after_optimize_falls_back_to_the_original() -> None:
    """The FORMAT no longer renders LlamaIndex's prompt: the checked branch runs the original."""
    engine = _engine()
    fast = TeolaQueryEngine(engine, decompose=True)
    engine._response_synthesizer.update_prompts({"text_qa_template": QUERY_FIRST})
    for q in QUESTIONS:
        _same(fast.query(q), engine.query(q))
    assert PrimitiveKind.DECODE not in _ran(fast, QUESTIONS[0])


@pytest.mark.parametrize("mode", ["tree_summarize", "accumulate", "compact_accumulate"])
def test_other_synthesizers_stay_one_call(mode: str) -> None:
    fast = _check(lambda: _engine(response_mode=mode), decompose=True)
    assert PrimitiveKind.DECODE not in _kinds(fast)
    assert "one call" in fast.explain()


def test_streaming_synthesizer_stays_one_call() -> None:
    fast = TeolaQueryEngine(_engine(streaming=True), decompose=True)
    assert PrimitiveKind.DECODE not in _kinds(fast)


def test_concurrent_queries_share_the_llm_engine_one_call_per_batch() -> None:
    engine = _engine(top_k=2)
    fast = TeolaQueryEngine(engine, decompose=True)
    questions = [f"question {i}" for i in range(6)]
    hook = Kinds()

    async def main() -> list[Any]:
        fast.runtime().add_hook(hook)
        return await asyncio.gather(*(fast.aquery(q) for q in questions))

    for got, q in zip(asyncio.run(main()), questions, strict=True):
        _same(got, engine.query(q))
    decodes = [size for kind, size in hook.batches if kind == PrimitiveKind.DECODE]
    assert decodes == [1] * 6
