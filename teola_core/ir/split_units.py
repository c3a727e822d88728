"""Split units: how an LLM's output text divides into items, incrementally.

Decode pipelining sends each completed item downstream while the model still writes.
A split unit must satisfy, for every text and every way of cutting it into deltas:

    items(feed(d1) + feed(d2) + ... + close()) == parse(d1 + d2 + ...)

so the pipelined graph computes exactly what the unsplit one does. Framework adapters
declare a split unit for the output parsers they recognise.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any


class ItemParser(ABC):
    """Incremental parser state for one generation."""

    @abstractmethod
    def feed(self, delta: str) -> list[Any]:
        """Consume more text; return the items completed by it."""

    @abstractmethod
    def close(self) -> list[Any]:
        """The text has ended; return the items still pending."""


class SplitUnit(ABC):
    name: str = "split-unit"

    @abstractmethod
    def parse(self, text: str) -> list[Any]:
        """All items of a complete text."""

    @abstractmethod
    def parser(self) -> ItemParser:
        """A fresh incremental parser."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash(type(self))


class Lines(SplitUnit):
    """One item per line; lines are stripped and empty lines dropped."""

    name = "lines"

    def parse(self, text: str) -> list[str]:
        return [line.strip() for line in text.split("\n") if line.strip()]

    def parser(self) -> ItemParser:
        return _LinesParser()


class _LinesParser(ItemParser):
    def __init__(self) -> None:
        self._pending = ""

    def feed(self, delta: str) -> list[Any]:
        self._pending += delta
        *complete, self._pending = self._pending.split("\n")
        return [line.strip() for line in complete if line.strip()]

    def close(self) -> list[Any]:
        rest, self._pending = self._pending.strip(), ""
        return [rest] if rest else []


class JsonArray(SplitUnit):
    """The items of a top-level JSON array, each emitted once its value is closed."""

    name = "json-array"

    def parse(self, text: str) -> list[Any]:
        value = json.loads(text)
        if not isinstance(value, list):
            raise ValueError(f"expected a JSON array, got {type(value).__name__}")
        return value

    def parser(self) -> ItemParser:
        return _JsonArrayParser()


class _JsonArrayParser(ItemParser):
    """Tracks depth and strings to find item boundaries at depth 1."""

    def __init__(self) -> None:
        self._text = ""
        self._scanned = 0
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._item_start: int | None = None
        self._emitted = 0
        self._closed = False

    def feed(self, delta: str) -> list[Any]:
        self._text += delta
        items: list[Any] = []
        while self._scanned < len(self._text):
            i, ch = self._scanned, self._text[self._scanned]
            self._scanned += 1
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
                continue
            if ch == '"':
                self._in_string = True
                if self._depth == 1 and self._item_start is None:
                    self._item_start = i
            elif ch in "[{":
                self._depth += 1
                if self._depth == 2 and self._item_start is None:
                    self._item_start = i
            elif ch in "]}":
                if self._depth == 1 and ch == "]":
                    items.extend(self._finish_item(i))
                    self._closed = True
                self._depth -= 1
            elif ch == "," and self._depth == 1:
                items.extend(self._finish_item(i))
            elif self._depth == 1 and not ch.isspace() and self._item_start is None:
                self._item_start = i
        return items

    def _finish_item(self, end: int) -> list[Any]:
        if self._item_start is None:
            return []
        raw = self._text[self._item_start : end]
        self._item_start = None
        self._emitted += 1
        return [json.loads(raw)]

    def close(self) -> list[Any]:
        # The whole text must parse as the array the items came from, so a malformed
        # output fails here exactly as `JsonArray.parse` would fail on it.
        whole = JsonArray().parse(self._text)
        if not self._closed or len(whole) != self._emitted:
            raise ValueError("JSON array output ended before its closing ']'")
        return []
