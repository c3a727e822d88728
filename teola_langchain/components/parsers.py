"""Output parsers Teola recognises, and the split units that make an LLM call splittable.

A recognised parser right after a model is folded into the LLM primitive: the decode's
"text" port carries the model's output and the parser runs inline on it
(`parse_output`, which is what `BaseOutputParser.invoke` computes, minus callbacks).
For parsers whose result is a list, the decode also gets a split unit, so decode
pipelining can hand each item downstream while the model still writes.

Equivalence is the contract: `unit.parse(text) == list(parser's result on text)` by
construction (the unit calls the parser), and every incremental `ItemParser` only emits
items that *no continuation of the text can change*, then checks at `close()` that what
it emitted is a prefix of `parse(full text)`. How each one knows an item is final:

- `NumberedListOutputParser`, `MarkdownListOutputParser`: their patterns match within
  one line (`[^\\n]+`), so matches that end before the last newline seen are final.
- `LineListOutputParser` (Teola's, below, and langchain-classic's, the multi-query
  retriever's, whose `parse` is the same code): a line is final once a later line holds
  a non-blank character (the parser strips the whole text, so trailing blank lines may
  still vanish).
- `CommaSeparatedListOutputParser`, `JsonOutputParser`: a later character can change
  earlier items (csv quoting, its fallback on a csv error; markdown-fenced or partial
  JSON), so their items are emitted at the end of the text only. Correct, not
  pipelined; a provably exact streaming parser for them is future work.

Parsers are recognised by exact class (a subclass may override `parse`);
langchain-classic's by qualified name, for the versions read (`classes.is_classic`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.output_parsers import (
    BaseOutputParser,
    CommaSeparatedListOutputParser,
    JsonOutputParser,
    MarkdownListOutputParser,
    NumberedListOutputParser,
    StrOutputParser,
)
from langchain_core.outputs import ChatGeneration, Generation

from teola_core.ir.split_units import ItemParser, SplitUnit
from teola_langchain.components.classes import class_of, is_classic


class LineListOutputParser(BaseOutputParser[list[str]]):
    """One item per non-empty line, as the multi-query retriever's parser does.

    `text.strip().split("\\n")` without the empty lines. Teola recognises this class and
    pipelines it line by line; use it for query expansion prompts that answer one query
    per line.
    """

    def parse(self, text: str) -> list[str]:
        return [line for line in text.strip().split("\n") if line]

    @property
    def _type(self) -> str:
        return "teola-line-list"


# langchain-classic's copy (`langchain_classic/retrievers/multi_query.py`): the same `parse`.
CLASSIC_LINE_LIST_PARSER = "langchain_classic.retrievers.multi_query.LineListOutputParser"

_LIST_PARSERS: tuple[type[BaseOutputParser[Any]], ...] = (
    CommaSeparatedListOutputParser,
    NumberedListOutputParser,
    MarkdownListOutputParser,
    LineListOutputParser,
)
_RECOGNISED: tuple[type[BaseOutputParser[Any]], ...] = (StrOutputParser, JsonOutputParser, *_LIST_PARSERS)


def is_line_list(step: object) -> bool:
    """Teola's `LineListOutputParser` or langchain-classic's (the same `parse`)."""
    return class_of(step) is LineListOutputParser or is_classic(step, CLASSIC_LINE_LIST_PARSER)


def is_recognised(step: object) -> bool:
    """A parser whose result Teola can compute inline, exactly."""
    return class_of(step) in _RECOGNISED or is_line_list(step)


def returns_list(parser: BaseOutputParser[Any]) -> bool:
    """Its result is always a list (so the decode's items *are* the parser's value)."""
    return class_of(parser) in _LIST_PARSERS or is_line_list(parser)


def parse_output(parser: BaseOutputParser[Any], output: Any) -> Any:
    """What `parser.invoke(output)` returns, without opening a callback run."""
    if isinstance(output, BaseMessage):
        return parser.parse_result([ChatGeneration(message=output)])
    return parser.parse_result([Generation(text=output)])


def output_text(output: Any) -> str:
    """The text a parser sees in a model output (a chat message or an LLM string)."""
    if isinstance(output, BaseMessage):
        return ChatGeneration(message=output).text
    return output if isinstance(output, str) else str(output)


class ParserItems(SplitUnit):
    """Items of a model output = `list(parser result)`: what a following map iterates."""

    def __init__(self, output_parser: BaseOutputParser[Any]) -> None:
        self.output_parser = output_parser
        self.name = f"langchain:{type(output_parser).__name__}"

    def parse(self, text: str) -> list[Any]:
        return list(parse_output(self.output_parser, text))

    def parse_output(self, output: Any) -> list[Any]:
        """Items of a whole model output (a message or a string)."""
        return list(parse_output(self.output_parser, output))

    def parser(self) -> ItemParser:
        kind = class_of(self.output_parser)
        if is_line_list(self.output_parser):
            return _StableItems(self, _final_lines)
        if kind in (NumberedListOutputParser, MarkdownListOutputParser):
            return _StableItems(self, _final_line_matches)
        return _StableItems(self, _nothing_final)

    def __repr__(self) -> str:
        return f"ParserItems({type(self.output_parser).__name__})"

    def __hash__(self) -> int:
        return hash((type(self), type(self.output_parser)))


def _nothing_final(unit: ParserItems, text: str) -> list[Any]:
    return []


def _final_line_matches(unit: ParserItems, text: str) -> list[Any]:
    """Items of the text up to its last newline: a line-local match there is final."""
    cut = text.rfind("\n") + 1
    return unit.parse(text[:cut]) if cut else []


def _final_lines(unit: ParserItems, text: str) -> list[Any]:
    """Lines before the last newline that a non-blank character follows.

    The parser takes `text.strip().split("\n")`: once a visible character follows a
    newline, the lines before it are lines of every continuation's stripped text.
    """
    body = text.lstrip()
    cut = body.rfind("\n", 0, len(body.rstrip()))
    return [line for line in body[:cut].split("\n") if line] if cut > 0 else []


class _StableItems(ItemParser):
    """Emits items as soon as they are final; `close` checks them against the whole text.

    `final(unit, text)` returns items of `text` that are a prefix of the items of every
    continuation of `text`. They can only grow when a newline, or a visible character
    after one, arrives.
    """

    def __init__(self, unit: ParserItems, final: Callable[[ParserItems, str], list[Any]]) -> None:
        self._unit = unit
        self._final = final
        self._text = ""
        self._emitted: list[Any] = []

    def feed(self, delta: str) -> list[Any]:
        self._text += delta
        # Items become final when a newline arrives, or (line lists) when the first visible
        # character after one does: look again only then.
        if self._final is _nothing_final or ("\n" not in delta and not self._opens_a_line(delta)):
            return []
        new = self._final(self._unit, self._text)[len(self._emitted) :]
        self._emitted.extend(new)
        return new

    def _opens_a_line(self, delta: str) -> bool:
        """Line lists: `delta` holds the first visible character of the text's last line."""
        if self._final is not _final_lines or not delta.strip():
            return False
        before = self._text[: len(self._text) - len(delta)]
        return "\n" in before and not before[before.rfind("\n") + 1 :].strip()

    def close(self) -> list[Any]:
        whole = self._unit.parse(self._text)
        if whole[: len(self._emitted)] != self._emitted:
            raise ValueError(
                f"{self._unit.name}: items emitted while streaming {self._emitted!r} are not a prefix of "
                f"the parsed output {whole!r}"
            )
        return whole[len(self._emitted) :]
