"""langchain-classic's `MultiQueryRetriever` traced into primitives: same documents, same answers."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import pytest

pytest.importorskip("langchain_classic")

from langchain_classic.retrievers.multi_query import MultiQueryRetriever
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.runnables import Runnable, RunnableLambda, RunnablePassthrough
from lc_fakes import EchoChat, assert_equivalent, format_docs, make_store

import teola
from teola_core.ir.kinds import PrimitiveKind
from teola_langchain import multi_query
from teola_langchain.tracer import OpaqueStepWarning

STORE = make_store()
QUESTIONS = ["what do cats like", "how do rivers form", "why jazz"]
ANSWER = ChatPromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}")
OWN_PROMPT = PromptTemplate.from_template("Write three search queries, one per line, for: {question}")


def retriever(**kwargs: Any) -> MultiQueryRetriever:
    inner = kwargs.pop("inner", None) or STORE.as_retriever(search_kwargs={"k": 2})
    return MultiQueryRetriever.from_llm(inner, EchoChat(style="lines"), **kwargs)


def rag(**kwargs: Any) -> Runnable[Any, Any]:
    context = retriever(**kwargs) | RunnableLambda(format_docs)
    return {"context": context, "question": RunnablePassthrough()} | ANSWER | EchoChat() | StrOutputParser()


SHAPES = {
    "rag-default-prompt": lambda: rag(),
    "rag-include-original": lambda: rag(include_original=True),
    "rag-own-prompt": lambda: rag(prompt=OWN_PROMPT),
    "retriever-alone": lambda: retriever(include_original=True),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_equivalent_in_every_calling_mode(shape: str) -> None:
    assert_equivalent(SHAPES[shape], QUESTIONS)


def partial_decodes(runnable: Any) -> int:
    return sum(n.kind is PrimitiveKind.PARTIAL_DECODE for n in runnable.plan.main.graph.nodes.values())


def test_the_default_prompts_three_queries_are_pipelined_into_retrieval() -> None:
    fast = teola.optimize(rag())
    assert partial_decodes(fast) == 3
    assert "VectorStoreRetriever.search x3" in fast.explain()
    assert not fast.plan.opaque


def test_an_own_prompt_is_pipelined_when_the_user_says_how_many_queries() -> None:
    assert partial_decodes(teola.optimize(rag(prompt=OWN_PROMPT))) == 0  # no hint: one decode
    assert partial_decodes(teola.optimize(rag(prompt=OWN_PROMPT), expected_items=3)) == 3


def test_the_generated_queries_are_logged_as_the_retriever_logs_them(caplog: pytest.LogCaptureFixture) -> None:
    def records() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "langchain_classic.retrievers.multi_query"]

    with caplog.at_level(logging.INFO, logger="langchain_classic.retrievers.multi_query"):
        rag().invoke(QUESTIONS[0])
        theirs = records()
        caplog.clear()
        teola.optimize(rag()).invoke(QUESTIONS[0])
        assert theirs and records() == theirs


@pytest.mark.parametrize(
    ("build", "why"),
    [
        (
            lambda: rag(inner=STORE.as_retriever(search_type="mmr", search_kwargs={"k": 2})),
            "inner retriever: search_type 'mmr'",
        ),
        (
            lambda: MultiQueryRetriever(
                retriever=STORE.as_retriever(search_kwargs={"k": 2}), llm_chain=_llm_chain(), include_original=True
            ),
            "its llm_chain is an LLMChain",
        ),
    ],
)
def test_what_cannot_be_traced_runs_as_one_call_with_the_same_result(build: Any, why: str) -> None:
    with pytest.warns(OpaqueStepWarning, match=why):
        teola.optimize(build())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_equivalent(build, QUESTIONS[:2], modes=("invoke", "ainvoke"))


def _llm_chain() -> Any:
    from langchain_classic.chains.llm import LLMChain
    from langchain_classic.retrievers.multi_query import LineListOutputParser

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LLMChain(llm=EchoChat(style="lines"), prompt=OWN_PROMPT, output_parser=LineListOutputParser())


def test_a_langchain_classic_version_not_read_is_not_recognised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(multi_query, "CLASSIC", ("langchain-classic", "0.1", "0.2"))
    with pytest.warns(OpaqueStepWarning, match="MultiQueryRetriever"):
        fast = teola.optimize(rag())
    assert partial_decodes(fast) == 0
    assert fast.invoke(QUESTIONS[0]) == rag().invoke(QUESTIONS[0])
