"""Equivalence suite: `optimize(chain)` returns what `chain` returns, for many chain shapes.

Every shape is checked with invoke, ainvoke, batch, abatch, stream and astream (streams
compared as joined chunks, and chunk by chunk where the chain streams through a model).
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable
from operator import itemgetter
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.language_models import FakeListChatModel, GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.output_parsers import (
    CommaSeparatedListOutputParser,
    JsonOutputParser,
    MarkdownListOutputParser,
    NumberedListOutputParser,
    StrOutputParser,
)
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder, PromptTemplate
from langchain_core.runnables import (
    Runnable,
    RunnableBranch,
    RunnableConfig,
    RunnableGenerator,
    RunnableLambda,
    RunnableParallel,
    RunnablePassthrough,
)
from langchain_core.runnables.passthrough import RunnablePick
from lc_fakes import EchoChat, EchoLLM, assert_equivalent, format_docs, make_store

from teola_langchain import LineListOutputParser, OpaqueStepWarning

STORE = make_store()
QUESTIONS = [{"question": "what do cats like"}, {"question": "how do rivers form"}, {"question": "why jazz"}]

ANSWER_PROMPT = ChatPromptTemplate.from_messages(
    [
        ("system", "Answer from the context only."),
        ("human", "Question: {question}\n\nContext:\n{context}"),
    ]
)
QUERY_PROMPT = PromptTemplate.from_template("Write three search queries, one per line, for: {question}")


def unique_docs(inputs: dict[str, Any]) -> dict[str, Any]:
    seen: dict[str | None, Document] = {}
    for docs in inputs["docs"]:
        for d in docs:
            seen.setdefault(d.id, d)
    return {"question": inputs["question"], "context": format_docs(list(seen.values()))}


def rerank(inputs: dict[str, Any]) -> list[Document]:
    words = set(inputs["question"].split())
    return sorted(inputs["docs"], key=lambda d: -len(words & set(d.page_content.split())))[:2]


def multi_query(style: str, parser: Any) -> Runnable[Any, Any]:
    retriever = STORE.as_retriever(search_kwargs={"k": 2})
    expand = QUERY_PROMPT | EchoChat(style=style) | parser
    return (
        {"queries": expand, "question": itemgetter("question")}
        | RunnablePassthrough.assign(docs=itemgetter("queries") | retriever.map())
        | RunnableLambda(unique_docs)
        | ANSWER_PROMPT
        | EchoChat()
        | StrOutputParser()
    )


async def async_double(x: int) -> int:
    await asyncio.sleep(0)
    return 2 * x


async def async_describe(d: dict[str, Any]) -> str:
    return f"{d['double']}/{d['same']}"


def flaky_lambda() -> Runnable[Any, Any]:
    """Fails the first attempt for each input (state per build: each chain has its own)."""
    attempts: dict[int, int] = {}

    def flaky(x: int) -> int:
        attempts[x] = attempts.get(x, 0) + 1
        if attempts[x] == 1:
            raise ConnectionError(f"transient failure for {x}")
        return x * 7

    return RunnableLambda(flaky)


def fail_on_odd(x: int) -> int:
    if x % 2:
        raise ValueError(f"odd {x}")
    return x


def words_upper(chunks: Any) -> Any:
    for chunk in chunks:
        yield chunk.upper()


async def awords_upper(chunks: Any) -> Any:
    async for chunk in chunks:
        yield chunk.upper()


class Doubler(Runnable[int, int]):
    """A user-defined Runnable subclass Teola cannot know: it runs as one opaque call."""

    def invoke(self, input: int, config: RunnableConfig | None = None, **kwargs: Any) -> int:
        return input * 2


Case = tuple[Callable[[], Runnable[Any, Any]], list[Any], dict[str, Any]]


def _cases() -> dict[str, Case]:
    retriever = STORE.as_retriever(search_kwargs={"k": 3})
    chat = EchoChat()
    return {
        "string_prompt_str_parser": (
            lambda: PromptTemplate.from_template("Tell me about {topic}") | EchoChat() | StrOutputParser(),
            [{"topic": "cats"}, {"topic": "dogs"}],
            {"exact_chunks": True},
        ),
        "chat_prompt_message_output": (
            lambda: ChatPromptTemplate.from_messages([("system", "Be terse."), ("human", "{q}")]) | EchoChat(),
            [{"q": "hello there"}, {"q": "bye"}],
            {"exact_chunks": True},
        ),
        "single_variable_prompt_non_dict_input": (
            lambda: ChatPromptTemplate.from_template("Echo {x}") | EchoChat() | StrOutputParser(),
            ["hello", "world"],
            {},
        ),
        "naive_rag": (
            lambda: (
                {"context": itemgetter("question") | retriever | format_docs, "question": itemgetter("question")}
                | ANSWER_PROMPT
                | EchoChat()
                | StrOutputParser()
            ),
            QUESTIONS,
            {"exact_chunks": True},
        ),
        "naive_rag_passthrough_question": (
            lambda: (
                {"context": retriever | format_docs, "question": RunnablePassthrough()}
                | ANSWER_PROMPT
                | EchoChat()
                | StrOutputParser()
            ),
            ["what do cats like", "chess openings"],
            {},
        ),
        "rag_with_assign": (
            lambda: (
                RunnablePassthrough.assign(context=itemgetter("question") | retriever | format_docs)
                | ANSWER_PROMPT
                | EchoChat()
                | StrOutputParser()
            ),
            QUESTIONS,
            {},
        ),
        "multi_query_numbered_list": (lambda: multi_query("numbered", NumberedListOutputParser()), QUESTIONS, {}),
        "multi_query_line_list": (lambda: multi_query("lines", LineListOutputParser()), QUESTIONS, {}),
        "multi_query_comma_list": (lambda: multi_query("comma", CommaSeparatedListOutputParser()), QUESTIONS, {}),
        "multi_query_json_list": (lambda: multi_query("json_list", JsonOutputParser()), QUESTIONS, {}),
        "rag_with_rerank_lambda": (
            lambda: (
                RunnablePassthrough.assign(docs=itemgetter("question") | retriever)
                | RunnablePassthrough.assign(context=RunnableLambda(rerank) | format_docs)
                | ANSWER_PROMPT
                | EchoChat()
                | StrOutputParser()
            ),
            QUESTIONS,
            {},
        ),
        "assign_pipeline": (
            lambda: (
                RunnablePassthrough.assign(a=lambda x: x["n"] + 1)
                .assign(b=lambda x: x["n"] * 2)
                .assign(c=lambda x: x["a"] + x["b"], d=itemgetter("n"))
                | RunnableLambda(lambda x: sorted(x.items()))
            ),
            [{"n": 1}, {"n": 5, "extra": "kept"}],
            {},
        ),
        "branch": (
            lambda: RunnableBranch(
                (lambda x: x["kind"] == "math", RunnableLambda(lambda x: x["a"] + x["b"])),
                (
                    lambda x: x["kind"] == "chat",
                    ChatPromptTemplate.from_template("{a} and {b}") | EchoChat() | StrOutputParser(),
                ),
                RunnableLambda(lambda x: f"default {x['kind']}"),
            ),
            [{"kind": "math", "a": 1, "b": 2}, {"kind": "chat", "a": "x", "b": "y"}, {"kind": "?", "a": 0, "b": 0}],
            {},
        ),
        "branch_with_identity_default": (
            lambda: (
                RunnableLambda(lambda x: x - 1)
                | RunnableBranch((lambda x: x > 0, RunnableLambda(lambda x: -x)), RunnablePassthrough())
            ),
            [3, -2, 1],
            {},
        ),
        "map_lambda": (
            lambda: RunnableLambda(lambda n: list(range(n))) | RunnableLambda(lambda y: y * y).map(),
            [3, 0, 5],
            {},
        ),
        "map_prompt_model_chain": (
            lambda: (
                RunnableLambda(lambda s: [{"topic": w} for w in s.split()])
                | (PromptTemplate.from_template("About {topic}") | EchoChat() | StrOutputParser()).map()
            ),
            ["cats dogs", "jazz"],
            {},
        ),
        "retriever_map": (lambda: RunnableLambda(str.split) | retriever.map(), ["cats jazz", "bread"], {}),
        "retriever_with_filter": (
            lambda: STORE.as_retriever(search_kwargs={"k": 2, "filter": lambda d: d.metadata["i"] % 2 == 0}),
            ["cats", "stars"],
            {},
        ),
        "nested_parallels": (
            lambda: (
                RunnableParallel(
                    a={"x": RunnableLambda(lambda v: v + 1), "y": {"z": RunnableLambda(lambda v: v * 10)}},
                    b=RunnablePassthrough(),
                )
                | RunnableLambda(lambda d: (d["a"]["x"], d["a"]["y"]["z"], d["b"]))
            ),
            [1, 7],
            {},
        ),
        "top_level_dict_literal": (
            lambda: RunnableParallel(
                {"plus": lambda v: v + 1, "minus": lambda v: v - 1, "same": RunnablePassthrough()}
            ),
            [10, 20],
            {},
        ),
        "fallbacks": (
            lambda: (
                RunnableLambda(lambda x: x + 1)
                | RunnableLambda(fail_on_odd).with_fallbacks([RunnableLambda(lambda x: -x)])
                | RunnableLambda(lambda x: x * 3)
            ),
            [1, 2, 5],
            {},
        ),
        "retry": (
            lambda: (
                RunnableLambda(lambda x: x + 1)
                | flaky_lambda().with_retry(stop_after_attempt=3, wait_exponential_jitter=False)
            ),
            [1, 2],
            {"fresh": True},
        ),
        "async_lambdas": (
            lambda: (
                RunnableLambda(async_double)
                | {"double": RunnableLambda(async_double), "same": RunnablePassthrough()}
                | RunnableLambda(async_describe)
            ),
            [1, 4],
            {"modes": ("ainvoke", "abatch", "astream")},
        ),
        "sync_and_async_lambda": (
            lambda: RunnableLambda(lambda x: x + 100, afunc=async_double) | RunnableLambda(lambda x: [x]),
            [1, 2],
            {},
        ),
        "itemgetter_and_pick": (
            lambda: (
                RunnablePassthrough.assign(total=lambda x: x["a"] + x["b"])
                | RunnableParallel(
                    total=itemgetter("total"),
                    pair=itemgetter("a", "b"),
                    first=RunnableLambda(itemgetter("items")) | itemgetter(0),
                    picked=RunnablePick(["a", "total", "nope"]),
                    one=RunnablePick("b"),
                    none=RunnablePick("missing"),
                )
            ),
            [{"a": 1, "b": 2, "items": ["p", "q"]}],
            {},
        ),
        "bind_stop": (
            lambda: PromptTemplate.from_template("List {topic}") | EchoChat(style="numbered").bind(stop=["2."]),
            [{"topic": "cats"}, {"topic": "jazz"}],
            {"exact_chunks": True},
        ),
        "generator_tail": (
            lambda: (
                PromptTemplate.from_template("About {topic}")
                | EchoChat()
                | StrOutputParser()
                | RunnableGenerator(words_upper, awords_upper)
            ),
            [{"topic": "cats"}],
            {"exact_chunks": True},
        ),
        "json_parser": (
            lambda: PromptTemplate.from_template("Describe {topic}") | EchoChat(style="json") | JsonOutputParser(),
            [{"topic": "stars"}],
            {},
        ),
        "markdown_list_parser": (
            lambda: (
                PromptTemplate.from_template("List {topic}")
                | EchoChat(style="markdown", n_items=4)
                | MarkdownListOutputParser()
            ),
            [{"topic": "bread"}, {"topic": "chess"}],
            {},
        ),
        "messages_placeholder": (
            lambda: (
                ChatPromptTemplate.from_messages(
                    [("system", "You are kind."), MessagesPlaceholder("history"), ("human", "{q}")]
                )
                | EchoChat()
                | StrOutputParser()
            ),
            [{"history": [HumanMessage("hi"), AIMessage("hello")], "q": "and now?"}, {"history": [], "q": "x"}],
            {},
        ),
        "optional_placeholder_and_partial": (
            lambda: (
                ChatPromptTemplate.from_messages(
                    [("system", "Tone: {tone}"), MessagesPlaceholder("history", optional=True), ("human", "{q}")]
                ).partial(tone="formal")
                | EchoChat()
                | StrOutputParser()
            ),
            [{"q": "hello"}, {"q": "hi", "tone": "casual"}],
            {},
        ),
        "passthrough_with_side_effect": (
            lambda: RunnablePassthrough(func=lambda x: None) | RunnableLambda(lambda x: x * 2),
            [3],
            {},
        ),
        "lambda_returning_runnable": (
            lambda: RunnableLambda(
                lambda x: RunnableLambda(lambda y: y * 3) if x > 0 else RunnableLambda(lambda y: -y)
            ),
            [2, -5],
            {},
        ),
        "with_config_inside": (
            lambda: (
                (PromptTemplate.from_template("{q}") | EchoChat() | StrOutputParser()).with_config(
                    tags=["inner"], run_name="inner", metadata={"m": 1}
                )
                | RunnableLambda(str.upper)
            ),
            [{"q": "tagged"}],
            {},
        ),
        "string_llm": (
            lambda: PromptTemplate.from_template("Complete: {x}") | EchoLLM() | StrOutputParser(),
            [{"x": "once upon"}],
            {"exact_chunks": True},
        ),
        "model_alone": (lambda: chat, ["just a string"], {"exact_chunks": True}),
        "model_map": (
            lambda: RunnableLambda(lambda s: [f"say {w}" for w in s.split()]) | EchoChat().map(),
            ["a b c"],
            {},
        ),
        "mmr_retriever_opaque": (
            lambda: STORE.as_retriever(search_type="mmr", search_kwargs={"k": 2, "fetch_k": 5}),
            ["cats"],
            {},
        ),
        "custom_runnable_opaque": (lambda: RunnableLambda(lambda x: x + 1) | Doubler(), [1, 2], {}),
        "fake_list_chat_model": (
            lambda: (
                ChatPromptTemplate.from_template("{q}")
                | FakeListChatModel(responses=["first answer", "second answer"])
                | StrOutputParser()
            ),
            [{"q": "one"}],
            {"fresh": True, "modes": ("invoke", "ainvoke", "stream", "astream"), "exact_chunks": True},
        ),
        "generic_fake_chat_model": (
            lambda: (
                ChatPromptTemplate.from_template("{q}")
                | GenericFakeChatModel(messages=iter(["streamed words here", "more words"]))
                | StrOutputParser()
            ),
            [{"q": "one"}],
            {"fresh": True, "modes": ("invoke", "ainvoke", "stream", "astream"), "exact_chunks": True},
        ),
    }


CASES = _cases()


@pytest.mark.parametrize("name", list(CASES))
def test_equivalent(name: str) -> None:
    build, inputs, options = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OpaqueStepWarning)
        assert_equivalent(build, inputs, **options)


def test_suite_covers_at_least_25_shapes() -> None:
    assert len(CASES) >= 25


def test_async_only_lambda_fails_sync_invoke_like_langchain() -> None:
    chain = RunnableLambda(async_double) | RunnableLambda(lambda x: x)
    fast = chain_fast = None
    with pytest.raises(TypeError) as expected:
        chain.invoke(1)
    from teola import optimize

    fast = chain_fast = optimize(chain)
    with pytest.raises(TypeError) as got:
        chain_fast.invoke(1)
    assert type(got.value) is type(expected.value)
    fast.close()
