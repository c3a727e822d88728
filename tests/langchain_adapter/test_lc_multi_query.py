"""langchain-classic's `MultiQueryRetriever` traced into primitives: same documents, same answers."""

from __future__ import annotations

import importlib.metadata
import logging
import warnings
from typing import Any

import pytest

pytest.importorskip("langchain_classic")

from langchain_classic.retrievers.multi_query import LineListOutputParser, MultiQueryRetriever
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.runnables import ConfigurableField, Runnable, RunnableLambda, RunnablePassthrough
from lc_fakes import EchoChat, assert_equivalent, format_docs, make_store

import teola
from teola_core.ir.kinds import PrimitiveKind
from teola_langchain.components import classes
from teola_langchain.components.parsers import LineListOutputParser as TeolaLineList
from teola_langchain.components.parsers import ParserItems
from teola_langchain.tracing.session import OpaqueStepWarning

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
    # a binding's run_name names the retriever's run, not the calls it makes (it sets no context)
    "with-run-name": lambda: retriever().with_config(run_name="expand") | RunnableLambda(format_docs),
    "with-config-and-a-longer-chain": lambda: (
        MultiQueryRetriever(
            retriever=STORE.as_retriever(search_kwargs={"k": 2}),
            llm_chain=RunnablePassthrough() | OWN_PROMPT | EchoChat(style="lines") | LineListOutputParser(),
        ).with_config(tags=["x"])
        | RunnableLambda(format_docs)
    ),
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


@pytest.mark.parametrize("include_original", [False, True])
def test_the_generated_queries_are_logged_as_the_retriever_logs_them(
    caplog: pytest.LogCaptureFixture, include_original: bool
) -> None:
    def records() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "langchain_classic.retrievers.multi_query"]

    with caplog.at_level(logging.INFO, logger="langchain_classic.retrievers.multi_query"):
        rag(include_original=include_original).invoke(QUESTIONS[0])
        theirs = records()
        caplog.clear()
        teola.optimize(rag(include_original=include_original)).invoke(QUESTIONS[0])
        # The library appends the question to the list it logged, lazily formatted: it shows.
        assert theirs and records() == theirs and (QUESTIONS[0] in theirs[0]) == include_original


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
        (
            lambda: MultiQueryRetriever(
                retriever=STORE.as_retriever(search_kwargs={"k": 2}), llm_chain=_llm_chain(subclass=True)
            ),
            "its llm_chain is an LLMChain",
        ),
        (
            # its output is a string: with include_original the library fails on `append`, and so must we
            lambda: MultiQueryRetriever(
                retriever=STORE.as_retriever(search_kwargs={"k": 2}),
                llm_chain=OWN_PROMPT | EchoChat(style="lines") | StrOutputParser(),
                include_original=True,
            ),
            "does not end in a model and a recognised list parser",
        ),
        (
            lambda: MultiQueryRetriever(
                retriever=STORE.as_retriever(search_kwargs={"k": 2}),
                llm_chain=OWN_PROMPT
                | EchoChat(style="lines").configurable_fields(n_items=ConfigurableField(id="n"))
                | LineListOutputParser(),
            ),
            "does not end in a model",  # a configurable model is not a plain model step
        ),
    ],
)
def test_what_cannot_be_traced_runs_as_one_call_with_the_same_result(build: Any, why: str) -> None:
    with pytest.warns(OpaqueStepWarning, match=why):
        teola.optimize(build())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_equivalent(build, QUESTIONS[:2], modes=("invoke", "ainvoke", "batch"))


def _llm_chain(subclass: bool = False) -> Any:
    from langchain_classic.chains.llm import LLMChain

    class MyChain(LLMChain):
        pass

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cls = MyChain if subclass else LLMChain
        return cls(llm=EchoChat(style="lines"), prompt=OWN_PROMPT, output_parser=LineListOutputParser())


@pytest.mark.parametrize("parser", [LineListOutputParser(), TeolaLineList()], ids=["langchain-classic", "teola"])
def test_a_line_is_handed_on_as_soon_as_the_next_one_starts(parser: Any) -> None:
    items = ParserItems(parser).parser()
    fed = [items.feed(delta) for delta in ("q1", "\n", "q2", " more", "\n", "q3")]
    assert fed == [[], [], ["q1"], [], [], ["q2 more"]]
    assert items.close() == ["q3"]


def test_the_classic_line_parser_in_a_users_own_chain_is_pipelined() -> None:
    def build() -> Runnable[Any, Any]:
        expand = OWN_PROMPT | EchoChat(style="lines") | LineListOutputParser()
        return expand | STORE.as_retriever(search_kwargs={"k": 2}).map()

    assert partial_decodes(teola.optimize(build(), expected_items=3)) == 3
    assert_equivalent(build, QUESTIONS)


def test_pre_releases_past_the_versions_read_are_not_recognised(monkeypatch: pytest.MonkeyPatch) -> None:
    for version, within in (("1.0.8", True), ("1.1.0rc1", False), ("1.1.0.dev0", False), ("0.9.9", False)):
        monkeypatch.setattr(importlib.metadata, "version", lambda name, v=version: v)
        assert classes.installed_within(*classes.LANGCHAIN_CLASSIC)[0] is within, version


def test_a_langchain_classic_version_not_read_is_not_recognised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(classes, "LANGCHAIN_CLASSIC", ("langchain-classic", "0.1", "0.2"))
    with pytest.warns(OpaqueStepWarning, match="MultiQueryRetriever"):
        fast = teola.optimize(rag())
    assert partial_decodes(fast) == 0
    assert fast.invoke(QUESTIONS[0]) == rag().invoke(QUESTIONS[0])
