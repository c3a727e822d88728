"""QueryPipeline (llama-index-core <= 0.12): rerank modules as RERANK, synthesizers decomposed.

Each shape: Teola's executor returns what QueryPipeline's returns (run, arun, batch,
intermediates), and the graph holds the primitives the shape must become.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from li_fakes import make_chat_llm, make_index, make_llm, overlap_rerank_class, sbert_rerank
from llama_index.core import PromptTemplate
from llama_index.core.postprocessor import SimilarityPostprocessor
from llama_index.core.query_pipeline import InputComponent, QueryPipeline
from llama_index.core.response_synthesizers import get_response_synthesizer

from teola_core.ir.kinds import PrimitiveKind
from teola_core.profiles.profile import Curve, LatencyProfile
from teola_llamaindex import OpaqueModuleWarning, TeolaQueryPipelineExecutor

INDEX = make_index()
OverlapRerank = overlap_rerank_class()
QUERY_FIRST = PromptTemplate("Query: {query_str}\nContext:\n{context_str}\nAnswer:")


def _llm() -> Any:
    return make_llm(max_tokens=None)


def rag_rerank_synth(
    postprocessor: Callable[[], Any], *, query_link: bool = True, mode: str = "compact", **synth: Any
) -> Callable[[], QueryPipeline]:
    def build() -> QueryPipeline:
        p = QueryPipeline()
        p.add_modules(
            {
                "input": InputComponent(),
                "retriever": INDEX.as_retriever(similarity_top_k=5),
                "rerank": postprocessor(),
                "synth": get_response_synthesizer(llm=synth.pop("llm", None) or _llm(), response_mode=mode, **synth),
            }
        )
        p.add_link("input", "retriever")
        p.add_link("retriever", "rerank", dest_key="nodes")
        if query_link:
            p.add_link("input", "rerank", dest_key="query_str")
        p.add_link("input", "synth", dest_key="query_str")
        p.add_link("rerank", "synth", dest_key="nodes")
        return p

    return build


def rag_synth(mode: str, top_k: int = 3, **synth: Any) -> Callable[[], QueryPipeline]:
    def build() -> QueryPipeline:
        p = QueryPipeline()
        p.add_modules(
            {
                "input": InputComponent(),
                "retriever": INDEX.as_retriever(similarity_top_k=top_k),
                "synth": get_response_synthesizer(
                    llm=synth.get("llm") or _llm(), response_mode=mode, **{k: v for k, v in synth.items() if k != "llm"}
                ),
            }
        )
        p.add_link("input", "retriever")
        p.add_link("input", "synth", dest_key="query_str")
        p.add_link("retriever", "synth", dest_key="nodes")
        return p

    return build


SHAPES: dict[str, Callable[[], QueryPipeline]] = {
    "sbert-rerank-compact": rag_rerank_synth(lambda: sbert_rerank(top_n=2)),
    "own-rerank-compact": rag_rerank_synth(lambda: OverlapRerank(top_n=3)),
    "own-rerank-no-query": rag_rerank_synth(lambda: OverlapRerank(top_n=3), query_link=False),
    "filter-simple-summarize": rag_rerank_synth(
        lambda: SimilarityPostprocessor(similarity_cutoff=0.5), mode="simple_summarize"
    ),
    "rerank-refine-one-node": rag_rerank_synth(lambda: OverlapRerank(top_n=1), mode="refine"),
    "rerank-refine-chain": rag_rerank_synth(lambda: OverlapRerank(top_n=3), mode="refine"),
    "synth-query-first": rag_synth("compact", text_qa_template=QUERY_FIRST),
    "synth-chat": rag_synth("compact", llm=make_chat_llm(max_tokens=None)),
    "synth-simple": rag_synth("simple_summarize", top_k=2),
}
QUESTIONS = ["what do cats do at dusk?", "refine mode chunk"]


def _quiet(pipeline: QueryPipeline, **options: Any) -> TeolaQueryPipelineExecutor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OpaqueModuleWarning)
        return TeolaQueryPipelineExecutor(pipeline, **options)


def _kinds(fast: TeolaQueryPipelineExecutor) -> set[PrimitiveKind]:
    assert fast.plan is not None, fast.fallback
    return {n.kind for n in fast.plan.graph.nodes.values()}


@pytest.mark.parametrize("decompose", [False, True])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("question", QUESTIONS)
def test_run_sync_and_async_equal_original(shape: str, question: str, decompose: bool) -> None:
    pipeline = SHAPES[shape]()
    expected = pipeline.run(input=question)
    fast = _quiet(pipeline, decompose=decompose)
    assert fast.run(input=question) == expected
    assert asyncio.run(fast.arun(input=question)) == expected
    fast.close()


@pytest.mark.parametrize("shape", ["sbert-rerank-compact", "own-rerank-compact", "own-rerank-no-query"])
def test_rerank_modules_are_rerank_primitives(shape: str) -> None:
    fast = _quiet(SHAPES[shape]())
    assert PrimitiveKind.RERANK in _kinds(fast)


def test_filter_module_stays_a_call() -> None:
    assert PrimitiveKind.RERANK not in _kinds(_quiet(SHAPES["filter-simple-summarize"]()))


@pytest.mark.parametrize(
    "shape", ["sbert-rerank-compact", "synth-query-first", "synth-simple", "rerank-refine-one-node"]
)
def test_synthesizers_decomposed(shape: str) -> None:
    kinds = _kinds(_quiet(SHAPES[shape](), decompose=True))
    assert {PrimitiveKind.FORMAT, PrimitiveKind.PREFILL, PrimitiveKind.DECODE, PrimitiveKind.CONDITION} <= kinds
    assert PrimitiveKind.DECODE not in _kinds(_quiet(SHAPES[shape]()))  # by default: the synthesizer's own call


@pytest.mark.parametrize("shape", ["sbert-rerank-compact", "rerank-refine-chain", "synth-chat"])
def test_run_with_intermediates_equal(shape: str) -> None:
    pipeline = SHAPES[shape]()
    fast = _quiet(pipeline)

    def plain(result: Any) -> Any:
        output, intermediates = result
        return output, {k: (v.inputs, v.outputs) for k, v in intermediates.items()}

    assert plain(fast.run_with_intermediates(input=QUESTIONS[0])) == plain(
        pipeline.run_with_intermediates(input=QUESTIONS[0])
    )


@pytest.mark.parametrize("shape", ["sbert-rerank-compact", "synth-query-first"])
def test_batch_equal(shape: str) -> None:
    pipeline = SHAPES[shape]()
    fast = _quiet(pipeline)
    batch = {"input": [*QUESTIONS, "how do dogs and wolves differ?"]}
    expected = pipeline.run(batch=True, **batch)
    assert fast.run(batch=True, **batch) == expected
    assert asyncio.run(fast.arun(batch=True, **batch)) == expected


def test_synthesizer_prefill_split_prefills_the_question_while_retrieval_runs() -> None:
    """The synthesizer's query_str link delivers before the nodes: its prefix is prefilled early."""
    slow = Curve(((1, 0.05),))
    profiles = {
        "embed:HashEmbedding": LatencyProfile("embed:HashEmbedding", {"embed": slow}),
        "vectordb:VectorIndexRetriever": LatencyProfile("vectordb:VectorIndexRetriever", {"search": slow}),
    }
    pipeline = SHAPES["synth-query-first"]()
    fast = _quiet(pipeline, profiles=profiles, decompose=True)
    assert fast.plan is not None
    prefix = [
        n for n in fast.plan.graph.nodes.values() if n.kind == PrimitiveKind.FORMAT and n.config.get("prefix_segments")
    ]
    assert prefix and {p.name for p in prefix[0].inputs} == {"query_str"}, fast.explain()
    assert fast.run(input=QUESTIONS[0]) == pipeline.run(input=QUESTIONS[0])


def test_sbert_rerank_without_a_query_fails_as_llamaindex_does() -> None:
    pipeline = rag_rerank_synth(lambda: sbert_rerank(top_n=2), query_link=False)()
    fast = _quiet(pipeline)
    with pytest.raises(ValueError, match="Missing query bundle") as theirs:
        pipeline.run(input="cats")
    with pytest.raises(ValueError, match="Missing query bundle") as ours:
        fast.run(input="cats")
    assert str(ours.value) == str(theirs.value)
    assert any("module rerank" in note for note in ours.value.__notes__)
