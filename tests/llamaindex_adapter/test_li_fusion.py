"""`QueryFusionRetriever` traced into primitives (llama-index-core 0.12 and 0.14): same nodes, same answers.

MockLLM echoes its prompt, so the "generated queries" are the prompt's own lines
(three of them): `num_queries` 3 keeps two (the cap), 6 asks for five and gets three.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from li_fakes import TEXTS, BrokenLLM, make_index, make_llm, recursive_retriever
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.retrievers import QueryFusionRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

import teola
from teola_core.ir.kinds import PrimitiveKind
from teola_llamaindex.fusion import FusionQueries

INDEX = make_index()
OTHER_INDEX = make_index()
QUESTIONS = ["what do cats do at dusk", "how do vector stores answer a query"]


def fusion(**kwargs: Any) -> QueryFusionRetriever:
    options: dict[str, Any] = {"llm": make_llm(max_tokens=None), "similarity_top_k": 3, "num_queries": 4}
    options.update(kwargs)
    retrievers = options.pop("retrievers", None) or [INDEX.as_retriever(similarity_top_k=2)]
    return QueryFusionRetriever(retrievers, **options)


def query_engine(retriever: BaseRetriever) -> RetrieverQueryEngine:
    return RetrieverQueryEngine.from_args(retriever, llm=make_llm(max_tokens=None))


SHAPES: dict[str, Callable[[], QueryFusionRetriever]] = {
    "simple": lambda: fusion(),
    "reciprocal-rerank": lambda: fusion(mode="reciprocal_rerank"),
    "relative-score": lambda: fusion(mode="relative_score"),
    "dist-based-score": lambda: fusion(mode="dist_based_score"),
    "more-lines-than-asked": lambda: fusion(num_queries=3),
    "fewer-lines-than-asked": lambda: fusion(num_queries=6, mode="reciprocal_rerank"),
    "no-generation": lambda: fusion(num_queries=1),
    "two-retrievers-weighted": lambda: fusion(
        retrievers=[INDEX.as_retriever(similarity_top_k=2), OTHER_INDEX.as_retriever(similarity_top_k=3)],
        mode="relative_score",
        retriever_weights=[0.7, 0.3],
    ),
    "sync-sub-retrievals": lambda: fusion(use_async=False),
    "one-generated-query-not-pipelined": lambda: fusion(num_queries=2),
}


def texts(nodes: list[NodeWithScore]) -> list[tuple[str, float | None]]:
    return [(n.node.get_content(), n.score) for n in nodes]


@pytest.mark.parametrize("decompose", [None, False, True])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_retrieval_and_answers_equal_sync_and_async(shape: str, decompose: bool) -> None:
    plain = query_engine(SHAPES[shape]())
    fast = teola.optimize(query_engine(SHAPES[shape]()), decompose=decompose)
    try:
        for q in QUESTIONS:
            want, got = plain.query(q), fast.query(q)
            assert texts(want.source_nodes) and texts(got.source_nodes) == texts(want.source_nodes)
            assert str(got) == str(want)
            want, got = asyncio.run(plain.aquery(q)), asyncio.run(fast.aquery(q))
            assert texts(got.source_nodes) == texts(want.source_nodes) and str(got) == str(want)
    finally:
        fast.close()


def test_generated_queries_are_pipelined_into_their_retrievals() -> None:
    fast = teola.optimize(query_engine(fusion(num_queries=4)), decompose=True)
    try:
        kinds = [n.kind for n in fast.graph.nodes.values()]
        assert kinds.count(PrimitiveKind.PARTIAL_DECODE) == 3
        assert kinds.count(PrimitiveKind.SEARCH) == 1 + 3  # the question's, then one per generated query
        assert "streams 3 expected items" in fast.explain()
    finally:
        fast.close()


def test_sync_path_stores_the_embedding_on_the_callers_bundle_as_llamaindex_does() -> None:
    plain = query_engine(fusion(use_async=False))
    fast = teola.optimize(query_engine(fusion(use_async=False)), decompose=True)
    try:
        mine, theirs = QueryBundle(QUESTIONS[0]), QueryBundle(QUESTIONS[0])
        plain.query(theirs)
        fast.query(mine)
        assert theirs.embedding is not None and mine.embedding == theirs.embedding
    finally:
        fast.close()


class KeywordRetriever(BaseRetriever):
    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        words = set(query_bundle.query_str.lower().split())
        return [
            NodeWithScore(node=TextNode(text=t, id_=f"k{i}"), score=1.0)
            for i, t in enumerate(TEXTS)
            if words & set(t.lower().split())
        ]


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda: fusion(retrievers=[KeywordRetriever()]), "not a VectorIndexRetriever"),
        (
            lambda: fusion(verbose=True, retrievers=[INDEX.as_retriever(similarity_top_k=2, verbose=True)]),
            "verbose sub-retriever",
        ),
        (
            lambda: fusion(
                use_async=False,
                retrievers=[INDEX.as_retriever(similarity_top_k=2), OTHER_INDEX.as_retriever(similarity_top_k=2)],
            ),
            "share one bundle",
        ),
    ],
)
def test_a_fusion_that_cannot_stream_keeps_its_records_path_with_the_same_answer(
    make: Callable[[], Any], why: str
) -> None:
    from teola_llamaindex.fusion import why_not_traced

    retriever = make()
    assert why in (why_not_traced(retriever) or "")
    plain, fast = query_engine(make()), teola.optimize(query_engine(make()), decompose=True)
    try:
        kinds = [n.kind for n in fast.graph.nodes.values()]
        # the default path: the generation on the LLM's engine, the sub-retrievers' own calls
        assert PrimitiveKind.EMBED not in kinds and PrimitiveKind.SEARCH not in kinds
        assert PrimitiveKind.PARTIAL_DECODE not in kinds and PrimitiveKind.DECODE in kinds
        q = "what do cats do at dusk"
        assert str(asyncio.run(fast.aquery(q))) == str(asyncio.run(plain.aquery(q)))
    finally:
        fast.close()


def test_a_failing_query_generation_reaches_the_caller_as_the_llms_own_error() -> None:
    fast = teola.optimize(query_engine(fusion(llm=BrokenLLM())), decompose=True)
    try:
        with pytest.raises(ConnectionError, match="model server down") as info:
            asyncio.run(fast.aquery("what do cats do at dusk"))
        assert any("generate_queries" in note for note in info.value.__notes__)
    finally:
        fast.close()


@given(
    text=st.text(alphabet="ab`\n \t", max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=6),
    limit=st.integers(min_value=1, max_value=5),
)
def test_fusion_queries_stream_to_exactly_the_librarys_parse(text: str, cuts: list[int], limit: int) -> None:
    unit = FusionQueries(limit)
    parser = unit.parser()
    items: list[QueryBundle] = []
    start = 0
    for cut in sorted(c for c in cuts if c <= len(text)):
        items += parser.feed(text[start:cut])
        start = cut
    items += parser.feed(text[start:])
    items += parser.close()
    expected = [q.strip() for q in text.strip("`").split("\n") if q.strip()][:limit]
    assert [b.query_str for b in items] == expected == [b.query_str for b in unit.parse(text)]


def test_query_pipeline_with_a_fusion_retriever_is_traced_and_equal() -> None:
    pytest.importorskip("llama_index.core.query_pipeline")
    from llama_index.core.query_pipeline import QueryPipeline

    def build() -> QueryPipeline:
        return QueryPipeline(chain=[fusion(mode="reciprocal_rerank")], verbose=False)

    plain, fast = build(), teola.optimize(build(), decompose=True)
    try:
        assert "own executor" not in fast.explain()
        for q in QUESTIONS:
            assert texts(fast.run(input=q)) == texts(plain.run(input=q))
            assert texts(asyncio.run(fast.arun(input=q))) == texts(asyncio.run(plain.arun(input=q)))
    finally:
        fast.close()


class ScriptedLLM(CustomLLM):
    """Writes the question back, then a repeated line: generated queries that collide.

    `stream`: "deltas" streams piece by piece, "text-only" streams cumulative text with
    `delta=None` (allowed by `CompletionResponse`), "none" cannot stream.
    """

    stream: str = "deltas"

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(is_chat_model=False)

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        question = prompt.split("Query: ")[1].split("\n")[0]
        return CompletionResponse(text=f"{question}\ncats at dusk\ncats at dusk\n")

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        if self.stream == "none":
            raise NotImplementedError("this model does not stream")
        text = self.complete(prompt).text

        def pieces() -> Any:
            for i in range(0, len(text), 5):
                if self.stream == "text-only":
                    yield CompletionResponse(text=text[: i + 5])
                else:
                    yield CompletionResponse(text=text[: i + 5], delta=text[i : i + 5])

        return pieces()


@pytest.mark.parametrize("stream", ["deltas", "text-only", "none"])
def test_how_the_model_streams_does_not_change_the_result(stream: str) -> None:
    def build() -> RetrieverQueryEngine:
        return query_engine(fusion(llm=ScriptedLLM(stream=stream), mode="reciprocal_rerank"))

    plain, fast = build(), teola.optimize(build(), decompose=True)
    try:
        assert sum(n.kind is PrimitiveKind.PARTIAL_DECODE for n in fast.graph.nodes.values()) == 3
        for q in QUESTIONS:
            assert texts(fast.query(q).source_nodes) == texts(plain.query(q).source_nodes)
            got, want = asyncio.run(fast.aquery(q)), asyncio.run(plain.aquery(q))
            assert texts(got.source_nodes) == texts(want.source_nodes)
    finally:
        fast.close()


def test_concurrent_queries_each_get_their_own_result() -> None:
    plain = query_engine(fusion(mode="relative_score"))
    fast = teola.optimize(query_engine(fusion(mode="relative_score")), decompose=True)
    questions = [f"{q} {i}" for i in range(4) for q in QUESTIONS]

    async def both() -> tuple[list[Any], list[Any]]:
        got = await asyncio.gather(*(fast.aquery(q) for q in questions))
        want = await asyncio.gather(*(plain.aquery(q) for q in questions))
        return got, want

    try:
        got, want = asyncio.run(both())
        assert [texts(r.source_nodes) for r in got] == [texts(r.source_nodes) for r in want]
    finally:
        fast.close()


@pytest.mark.parametrize(
    "make",
    [
        recursive_retriever,
        lambda: fusion(retrievers=[recursive_retriever()], num_queries=3, similarity_top_k=4),
        lambda: fusion(retrievers=[recursive_retriever()], num_queries=3, similarity_top_k=4, use_async=False),
    ],
    ids=["vector-index", "fusion", "fusion-sync-sub-retrievals"],
)
def test_index_nodes_are_resolved_with_the_bundle_the_library_passes(make: Callable[[], BaseRetriever]) -> None:
    plain, fast = query_engine(make()), teola.optimize(query_engine(make()), decompose=True)
    q = "what do cats do at dusk"
    try:
        want = texts(plain.query(q).source_nodes)
        assert any(text in TEXTS[3:] for text, _ in want)  # SUB_INDEX was searched
        assert texts(fast.query(q).source_nodes) == want
        got, want_async = asyncio.run(fast.aquery(q)), asyncio.run(plain.aquery(q))
        assert texts(got.source_nodes) == texts(want_async.source_nodes)
    finally:
        fast.close()


def test_a_verbose_retriever_prints_its_generated_queries_as_llamaindex_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    plain, fast = (
        query_engine(fusion(num_queries=3, verbose=True)),
        teola.optimize(query_engine(fusion(num_queries=3, verbose=True)), decompose=True),
    )
    try:
        assert sum(n.kind is PrimitiveKind.PARTIAL_DECODE for n in fast.graph.nodes.values()) == 2
        for q in QUESTIONS:
            plain.query(q)
            theirs = capsys.readouterr().out
            fast.query(q)
            asyncio.run(fast.aquery(q))
            assert "Generated queries:" in theirs and capsys.readouterr().out == theirs * 2
    finally:
        fast.close()
