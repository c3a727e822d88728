"""Split units equal their parsers for every way of streaming a text; prompt prefixes are prefixes."""

from __future__ import annotations

import asyncio
import contextvars
import random
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.output_parsers import (
    CommaSeparatedListOutputParser,
    JsonOutputParser,
    MarkdownListOutputParser,
    NumberedListOutputParser,
)
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder, PromptTemplate
from langchain_core.runnables.config import ensure_config
from lc_fakes import EchoChat

from teola_core.engines.protocol import Call, StreamResult
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.node import Node
from teola_core.ir.types import KVHandle
from teola_langchain import LineListOutputParser
from teola_langchain.components.parsers import ParserItems
from teola_langchain.components.prompts import PromptPrefix, describe, render_prompt
from teola_langchain.engines import LangChainLLMEngine
from teola_langchain.execution.context import QueryContext, StepRef
from teola_langchain.execution.steps import ModelStep

PARSERS = [
    NumberedListOutputParser(),
    MarkdownListOutputParser(),
    LineListOutputParser(),
    CommaSeparatedListOutputParser(),
    JsonOutputParser(),
]
TEXTS = [
    "Here you go:\n1. cats\n2. dogs and  more \n3. rivers\n",
    "1.\nfoo\n2. bar\n\n10. baz",
    "  - a\n* b\n -not\n- c  \n\n",
    "\n\n  first line \nsecond\n\n third  \n  \n",
    'a, b, "c, d", e\nf,g',
    '```json\n["x", "y", {"z": 1}]\n```',
    "",
    "no list here",
]
ALPHABET = st.sampled_from([*"ab1.-* ,\n\"[]{}'", "12. ", "- ", "\n\n"])


def stream_items(unit: ParserItems, text: str, cuts: list[int]) -> tuple[list[Any], list[int]]:
    """Items fed delta by delta; and how many were out before the text ended."""
    parser = unit.parser()
    items: list[Any] = []
    early: list[int] = []
    bounds = [0, *sorted(c % (len(text) + 1) for c in cuts), len(text)]
    for a, b in pairwise(bounds):
        items.extend(parser.feed(text[a:b]))
        early.append(len(items))
    return items + parser.close(), early


def parse_or_error(unit: ParserItems, text: str) -> Any:
    try:
        return unit.parse(text)
    except Exception as exc:
        return type(exc)


@pytest.mark.parametrize("parser", PARSERS, ids=lambda p: type(p).__name__)
@pytest.mark.parametrize("text", TEXTS)
def test_split_unit_parse_is_the_parsers_result(parser: Any, text: str) -> None:
    unit = ParserItems(parser)
    try:
        expected = list(parser.invoke(text))
    except Exception as exc:
        assert parse_or_error(unit, text) is type(exc)
        return
    assert unit.parse(text) == expected
    assert unit.parse_output(AIMessage(text)) == list(parser.invoke(AIMessage(text)))
    rng = random.Random(len(text))
    for _ in range(20):
        cuts = [rng.randrange(len(text) + 1) for _ in range(rng.randrange(6))]
        assert stream_items(unit, text, cuts)[0] == expected


@settings(max_examples=150, deadline=None)
@given(st.lists(ALPHABET, max_size=40).map("".join), st.lists(st.integers(0, 200), max_size=8))
def test_incremental_items_equal_parse_for_any_cuts(text: str, cuts: list[int]) -> None:
    for parser in PARSERS[:3]:  # the line-based units that emit early
        unit = ParserItems(parser)
        assert stream_items(unit, text, cuts)[0] == unit.parse(text)


def test_line_based_units_emit_items_before_the_text_ends() -> None:
    unit = ParserItems(NumberedListOutputParser())
    items, early = stream_items(unit, "1. a\n2. b\n3. c", [5, 10])
    assert items == ["a", "b", "c"] and early[:2] == [1, 2]
    line_unit = ParserItems(LineListOutputParser())
    items, early = stream_items(line_unit, "x \ny\nz", [3, 5])
    assert items == ["x ", "y", "z"] and early[:2] == [0, 1]  # "x " is final once "y" shows


def test_line_list_parser_matches_the_multi_query_parser() -> None:
    # the multi-query retriever's parser: `text.strip().split("\n")` without empty lines
    assert LineListOutputParser().parse("\n a\n\nb \n") == ["a", "b"]
    assert LineListOutputParser().parse("x \n  y \n\n") == ["x ", "  y"]


CHAT = ChatPromptTemplate.from_messages(
    [
        ("system", "You answer {style}."),
        MessagesPlaceholder("history", optional=True),
        ("human", "Question: {question}\nContext: {context}\nAnswer:"),
    ]
).partial(style="briefly")
VALUES = {"question": "why is the sky blue", "context": "light scatters", "history": [HumanMessage("hi")]}


def test_describe_lists_segments_message_by_message() -> None:
    template = describe(CHAT)
    assert [s.var for s in template.segments if s.var] == ["style", "history", "question", "context"]
    assert set(template.variables) == {"style", "history", "question", "context"}
    assert render_prompt(CHAT, {**VALUES, "style": describe(CHAT).prompt.partial_variables["style"]}) == CHAT.invoke(
        VALUES
    )


@pytest.mark.parametrize("values", [VALUES, {k: v for k, v in VALUES.items() if k != "history"}])
def test_every_prefix_renders_the_start_of_the_prompt(values: dict[str, Any]) -> None:
    template = describe(CHAT)
    full = CHAT.invoke(values).to_messages()
    for k in range(len(template.segments) + 1):
        prefix = template.prefix(k).render({**values, "style": "briefly"})
        assert isinstance(prefix, PromptPrefix)
        n = len(prefix.messages)
        assert list(prefix.messages) == full[:n]
        if prefix.open_role is not None:
            assert full[n].content.startswith(prefix.open_text)
            assert full[n].type == prefix.open_role


def test_string_prompt_prefix() -> None:
    prompt = PromptTemplate.from_template("Q: {q} C: {c}")
    template = describe(prompt)
    assert template.prefix(2).render({"q": "why"}).open_text == "Q: why"
    assert render_prompt(prompt, {"q": "a", "c": "b"}) == prompt.invoke({"q": "a", "c": "b"})


def test_llm_engine_stream_and_decode_agree_with_the_split_unit() -> None:
    model = EchoChat(style="numbered", n_items=4)
    unit = ParserItems(NumberedListOutputParser())
    engine = LangChainLLMEngine("llm", model)
    step = ModelStep(model, StepRef())
    node = Node("decode", PrimitiveKind.DECODE, (), (), engine="llm", config={"split_unit": unit, "step": step})
    prompt = ChatPromptTemplate.from_template("list {x}").invoke({"x": "cats"})

    async def main() -> tuple[dict[str, Any], list[Any], Any]:
        ctx = QueryContext("q1", ensure_config({}), False, contextvars.copy_context())
        call = Call("q1", node, {"kv": KVHandle("llm", prompt)}, ctx)
        (decoded,) = await engine.run([call])
        parser = unit.parser()
        items: list[Any] = []
        final = None
        async for delta in engine.stream(call):
            if isinstance(delta, StreamResult):
                final = delta.value
            else:
                items.extend(parser.feed(delta))
        return decoded, items + parser.close(), final

    decoded, streamed, final = asyncio.run(main())
    assert decoded["items"] == streamed == NumberedListOutputParser().invoke(model.invoke(prompt))
    assert final.content == decoded["text"].content  # the model's own invoke output, streamed or not
