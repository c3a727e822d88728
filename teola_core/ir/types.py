"""Port types and the small value types that flow along data edges."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class PortType(StrEnum):
    """Type tags of ports. `ANY` is compatible with every type."""

    ANY = "any"
    TEXT = "text"
    TEXTS = "list[text]"
    VECTORS = "list[vector]"
    INDEX = "index"
    DOCS = "list[doc]"
    HITS = "list[list[doc]]"
    SCORED = "list[scored]"
    PROMPT = "prompt"
    KV = "kv"
    ITEMS = "list[item]"
    BRANCH = "branch"


_LISTS = frozenset({PortType.TEXTS, PortType.VECTORS, PortType.DOCS, PortType.HITS, PortType.SCORED, PortType.ITEMS})


def compatible(produced: PortType, consumed: PortType) -> bool:
    """Equal types, `ANY` on either side, or `ITEMS` (a list of anything) against a list type."""
    if produced == consumed or PortType.ANY in (produced, consumed):
        return True
    return PortType.ITEMS in (produced, consumed) and produced in _LISTS and consumed in _LISTS


@dataclass(frozen=True)
class Document:
    """A retrievable passage. `metadata` is carried along untouched."""

    id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class Scored:
    """A document with a relevance score (higher is better)."""

    doc: Document
    score: float


@dataclass(frozen=True)
class KVHandle:
    """A reference to prompt state held by an LLM engine (its KV cache).

    `prompt` is the text whose state is held; `engine` names the engine that holds it
    (decode must run where the prefill ran); `token` is engine-private.
    """

    engine: str
    prompt: Any
    token: Any = None
