"""langchain-classic's `ContextualCompressionRetriever` with a `CrossEncoderReranker`: EMBED + SEARCH + RERANK.

Same documents, same answers, same finished traces as plain LangChain in every calling mode
(`assert_equivalent`), the compressor's errors included; the graph has the primitives;
what is not proven runs as one call and says why; several queries share one `score`
call only for a cross encoder registered as scoring each pair on its own.
"""

from __future__ import annotations

import asyncio
import re
import threading
import warnings
from typing import Any

import pytest

pytest.importorskip("langchain_classic")

from engine_watch import hold_batches
from langchain_classic.retrievers.contextual_compression import ContextualCompressionRetriever
from langchain_classic.retrievers.document_compressors.base import DocumentCompressorPipeline
from langchain_classic.retrievers.document_compressors.chain_extract import LLMChainExtractor
from langchain_classic.retrievers.document_compressors.cross_encoder_rerank import CrossEncoderReranker
from langchain_classic.retrievers.multi_query import LineListOutputParser
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.cross_encoders import BaseCrossEncoder
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.runnables import Runnable, RunnableLambda, RunnablePassthrough
from lc_fakes import EchoChat, assert_equivalent, format_docs, make_store, run_mode

import teola
from teola_benchmarks.langchain.traces import TraceRecorder
from teola_core.ir.kinds import PrimitiveKind as K
from teola_langchain import register_per_pair_cross_encoder
from teola_langchain.components import classes
from teola_langchain.engines import LangChainRerankEngine
from teola_langchain.tracing.session import OpaqueStepWarning

STORE = make_store()
QUESTIONS = ["what do cats like", "how do rivers form", "why jazz and chess"]
ANSWER = ChatPromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}")
QUERIES = PromptTemplate.from_template("Write three search queries, one per line, for: {question}")


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


class Overlap(BaseCrossEncoder):
    """Scores a pair by the words its texts share (a pure function of the pair); counts its calls.

    `fail_on`: a word whose presence in the query makes `score` raise (the compressor failing)."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list[int] = []  # pairs per call
        self.fail_on = fail_on
        self._lock = threading.Lock()

    def score(self, text_pairs: list[tuple[str, str]]) -> list[float]:
        with self._lock:
            self.calls.append(len(text_pairs))
        if self.fail_on is not None and any(self.fail_on in words(q) for q, _ in text_pairs):
            raise ValueError(f"cannot score {self.fail_on}")
        return [len(words(q) & words(t)) + 0.01 * len(t) for q, t in text_pairs]


class PairwiseOverlap(Overlap):
    """The same scorer, registered as scoring each pair on its own."""


register_per_pair_cross_encoder(PairwiseOverlap)


class MyReranker(CrossEncoderReranker):
    """A subclass may compute something else: not covered by the proof."""


def ccr(model: BaseCrossEncoder | None = None, top_n: int = 2, **search: Any) -> ContextualCompressionRetriever:
    return ContextualCompressionRetriever(
        base_compressor=CrossEncoderReranker(model=model or Overlap(), top_n=top_n),
        base_retriever=STORE.as_retriever(search_kwargs={"k": 5, **search}),
    )


def rag(retriever: Any = None) -> Runnable[Any, Any]:
    return {"context": retriever or ccr(), "question": RunnablePassthrough()} | ANSWER | EchoChat() | StrOutputParser()


def mapped() -> Runnable[Any, Any]:
    return QUERIES | EchoChat(style="lines") | LineListOutputParser() | ccr().map()


SHAPES = {
    "rag": rag,
    "rag-formatted": lambda: rag(ccr() | RunnableLambda(format_docs)),
    "retriever-alone": ccr,
    "with-config": lambda: ccr().with_config(tags=["x"], metadata={"m": 1}, run_name="compressed") | format_docs,
    "own-tags": lambda: ContextualCompressionRetriever(
        base_compressor=CrossEncoderReranker(model=Overlap(), top_n=3),
        base_retriever=STORE.as_retriever(search_kwargs={"k": 4}, tags=["inner"]),
        tags=["outer"],
    ),
    "registered-model": lambda: rag(ccr(PairwiseOverlap())),
    "nothing-found": lambda: rag(ccr(filter=lambda doc: False)),  # no documents: no compressor call
    "map": mapped,
}


def upstream(graph: Any, node_id: str) -> set[str]:
    seen, todo = set(), [node_id]
    while todo:
        for p in graph.predecessors(todo.pop()):
            if p not in seen:
                seen.add(p)
                todo.append(p)
    return seen


def kinds(fast: Any) -> list[K]:
    return [n.kind for sub in fast.plan.graphs() for n in sub.pgraph.nodes.values()]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_equivalent_in_every_calling_mode(shape: str) -> None:
    assert_equivalent(SHAPES[shape], QUESTIONS)


def test_a_pipelined_map_runs_the_retriever_per_item_as_primitives() -> None:
    assert_equivalent(mapped, QUESTIONS, expected_items=3)
    fast = teola.optimize(mapped(), expected_items=3)
    fast.close()
    main = [n.kind for n in fast.plan.main.graph.nodes.values()]
    assert main.count(K.PARTIAL_DECODE) == 3
    assert {K.EMBED, K.SEARCH, K.RERANK} <= set(kinds(fast)) and not fast.plan.opaque


def test_no_documents_make_no_compressor_call() -> None:
    model = Overlap()
    fast = teola.optimize(rag(ccr(model, filter=lambda doc: False)), execution="graph")
    try:
        assert fast.invoke(QUESTIONS[0]) == asyncio.run(fast.ainvoke(QUESTIONS[0]))
    finally:
        fast.close()
    assert model.calls == []


def test_the_retriever_runs_as_embed_search_and_rerank() -> None:
    fast = teola.optimize(rag())
    fast.close()
    assert not fast.plan.opaque
    graph = fast.plan.main.pgraph
    assert [k for k in kinds(fast) if k in (K.EMBED, K.SEARCH, K.RERANK)] == [K.EMBED, K.SEARCH, K.RERANK]
    rerank = next(n for n in graph.nodes.values() if n.kind is K.RERANK)
    search = next(n for n in graph.nodes.values() if n.kind is K.SEARCH)
    assert rerank.engine == "rerank:CrossEncoderReranker" and rerank.config["top_k"] == 2
    assert search.id in upstream(graph, rerank.id)
    assert not rerank.caps.batchable and not rerank.caps.splittable  # unregistered: one query per call
    text = fast.explain()
    assert "runs as EMBED + SEARCH (VectorStoreRetriever) + RERANK (CrossEncoderReranker over Overlap" in text
    assert "ContextualCompressionRetriever.rerank: rerank @rerank:CrossEncoderReranker" in text
    assert "rerank:CrossEncoderReranker: reranks are sent per query" in text


def test_the_retriever_runs_open_as_langchain_opens_them() -> None:
    """Metadata (not part of the trees) too: each retriever run's, as `BaseRetriever` gives it."""

    class Starts(BaseCallbackHandler):
        def __init__(self) -> None:
            self.seen: list[tuple[str, Any, Any]] = []

        def on_retriever_start(self, serialized: Any, query: str, **kwargs: Any) -> None:
            self.seen.append((kwargs["name"], sorted(kwargs.get("tags") or []), kwargs.get("metadata")))

    build = SHAPES["with-config"]
    plain, ours = Starts(), Starts()
    build().invoke(QUESTIONS[0], {"callbacks": [plain], "metadata": {"user": "u"}})
    fast = teola.optimize(build(), execution="graph")
    try:
        fast.invoke(QUESTIONS[0], {"callbacks": [ours], "metadata": {"user": "u"}})
    finally:
        fast.close()
    assert ours.seen == plain.seen and len(plain.seen) == 2


@pytest.mark.parametrize("mode", ["invoke", "ainvoke", "batch"])
def test_a_run_name_in_the_callers_config_names_the_outer_run_only(mode: str) -> None:
    """LangChain's retriever sets no context of its own: its base retriever's run keeps its name."""
    ours, plain = TraceRecorder(), TraceRecorder()
    config = {"run_name": "mine", "tags": ["t"], "metadata": {"m": 2}}
    run_mode(ccr(), mode, QUESTIONS[:2], {**config, "callbacks": [plain]})
    fast = teola.optimize(ccr(), execution="graph")
    try:
        run_mode(fast, mode, QUESTIONS[:2], {**config, "callbacks": [ours]})
    finally:
        fast.close()
    assert ours.trees() == plain.trees()
    assert [c[0] for c in plain.trees()[0][6]] == ["VectorStoreRetriever"]


def test_a_failing_compressor_raises_as_in_langchain_with_the_same_trace() -> None:
    def build() -> Runnable[Any, Any]:
        return rag(ccr(Overlap(fail_on="jazz")))

    def alone() -> Runnable[Any, Any]:  # the retriever is the parallel's only branch
        return {"context": ccr(Overlap(fail_on="jazz"))} | ANSWER | EchoChat()

    # (LangChain's own streams of a parallel whose branch fails end the other branch's run or
    # not, by timing: the streams are compared where only one branch runs)
    assert_equivalent(build, [QUESTIONS[2]], modes=("invoke", "ainvoke", "batch", "abatch"))
    assert_equivalent(build, QUESTIONS, modes=("invoke", "ainvoke", "batch", "abatch"))  # one query of several
    assert_equivalent(alone, [QUESTIONS[2]])
    assert_equivalent(lambda: ccr(Overlap(fail_on="jazz")), [QUESTIONS[2]], modes=("invoke", "ainvoke"))


@pytest.mark.parametrize(
    ("build", "why"),
    [
        (
            lambda: ContextualCompressionRetriever(
                base_compressor=LLMChainExtractor.from_llm(EchoChat()),
                base_retriever=STORE.as_retriever(search_kwargs={"k": 2}),
            ),
            "its base_compressor LLMChainExtractor is not a CrossEncoderReranker",
        ),
        (
            # (EmbeddingsFilter would be the other classic example; it needs langchain-community)
            lambda: ContextualCompressionRetriever(
                base_compressor=DocumentCompressorPipeline(transformers=[CrossEncoderReranker(model=Overlap())]),
                base_retriever=STORE.as_retriever(search_kwargs={"k": 4}),
            ),
            "its base_compressor DocumentCompressorPipeline is not a CrossEncoderReranker",
        ),
        (
            lambda: ContextualCompressionRetriever(
                base_compressor=MyReranker(model=Overlap(), top_n=2),
                base_retriever=STORE.as_retriever(search_kwargs={"k": 4}),
            ),
            "its base_compressor MyReranker is not a CrossEncoderReranker",
        ),
        (
            lambda: ContextualCompressionRetriever(
                base_compressor=CrossEncoderReranker(model=Overlap(), top_n=2),
                base_retriever=STORE.as_retriever(search_type="mmr", search_kwargs={"k": 2}),
            ),
            "base retriever: search_type 'mmr'",
        ),
        (
            lambda: ContextualCompressionRetriever(
                base_compressor=CrossEncoderReranker(model=Overlap(), top_n=2),
                base_retriever=RunnableLambda(lambda q: STORE.similarity_search(q, k=3)),
            ),
            "base retriever: RunnableLambda is not a plain VectorStoreRetriever",
        ),
    ],
    ids=["llm-extractor", "pipeline", "subclass", "mmr-base", "lambda-base"],
)
def test_what_is_not_proven_runs_as_one_call_and_explain_says_why(build: Any, why: str) -> None:
    with pytest.warns(OpaqueStepWarning, match=why):
        fast = teola.optimize(rag(build()))
    assert K.RERANK not in kinds(fast)
    assert why in fast.explain() and "would run as EMBED + SEARCH + RERANK" in fast.explain()
    fast.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_equivalent(lambda: rag(build()), QUESTIONS[:2], modes=("invoke", "ainvoke", "batch"))


def test_a_replaced_compressor_method_is_not_covered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CrossEncoderReranker, "compress_documents", lambda self, docs, query, callbacks=None: docs)
    with pytest.warns(OpaqueStepWarning, match="compress_documents is not langchain-classic's own"):
        fast = teola.optimize(rag())
    assert K.RERANK not in kinds(fast)
    assert fast.invoke(QUESTIONS[0]) == rag().invoke(QUESTIONS[0])
    fast.close()


def test_a_langchain_classic_version_not_read_is_not_recognised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(classes, "LANGCHAIN_CLASSIC", ("langchain-classic", "0.1", "0.2"))
    with pytest.warns(OpaqueStepWarning, match="its source was read for langchain-classic >= 0.1, < 0.2"):
        fast = teola.optimize(rag())
    assert K.RERANK not in kinds(fast)
    assert fast.invoke(QUESTIONS[0]) == rag().invoke(QUESTIONS[0])
    fast.close()


N = 6
MANY = [f"{QUESTIONS[i % 3]} {i}" for i in range(N)]


def concurrent_scores(model: Overlap) -> tuple[list[Any], LangChainRerankEngine]:
    """N concurrent `ainvoke`s of a RAG chain over the model; the rerank engine's first batch
    lasts until every query's call has reached it."""
    fast = teola.optimize(rag(ccr(model)), execution="graph")
    engine = fast._engines.engines["rerank:CrossEncoderReranker"]

    async def main() -> list[Any]:
        hold_batches(fast.runtime(), engine, N)
        return list(await asyncio.gather(*(fast.ainvoke(q) for q in MANY)))

    try:
        return asyncio.run(main()), engine
    finally:
        fast.close()


@pytest.mark.parametrize("registered", [True, False])
def test_queries_share_a_score_call_only_for_a_registered_cross_encoder(registered: bool) -> None:
    model = PairwiseOverlap() if registered else Overlap()
    expected = [rag(ccr(Overlap())).invoke(q) for q in MANY]
    got, engine = concurrent_scores(model)
    assert got == expected
    assert engine.joint is registered
    if registered:
        assert len(model.calls) < N and engine.joint_calls >= 1 and sum(model.calls) == 5 * N
    else:
        assert model.calls == [5] * N and engine.joint_calls == 0


def test_a_failing_joint_call_runs_each_query_alone() -> None:
    model = PairwiseOverlap(fail_on="jazz")
    fast = teola.optimize(rag(ccr(model)), execution="graph")
    engine = fast._engines.engines["rerank:CrossEncoderReranker"]

    async def main() -> list[Any]:
        hold_batches(fast.runtime(), engine, N)
        return list(await asyncio.gather(*(fast.ainvoke(q) for q in MANY), return_exceptions=True))

    try:
        got = asyncio.run(main())
    finally:
        fast.close()
    for q, result in zip(MANY, got, strict=True):
        if "jazz" in q:
            assert isinstance(result, ValueError) and str(result) == "cannot score jazz"
        else:
            assert result == rag(ccr(Overlap())).invoke(q)
    assert engine.joint_failures >= 1


def test_register_takes_cross_encoder_classes_only() -> None:
    with pytest.raises(TypeError):
        register_per_pair_cross_encoder(Overlap())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        register_per_pair_cross_encoder(dict)
