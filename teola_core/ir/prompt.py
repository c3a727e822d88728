"""Prompt templates as ordered segments, so a pass can see which prefix is ready.

Prefill split may only prefill a *prefix* of the final prompt (causal attention): the
template is a sequence of literal and variable segments, and `prefix(k)` renders the
first k of them, which is byte-for-byte the start of the full rendering.

    >>> t = PromptTemplate.parse("Answer {question} using {context}.")
    >>> t.variables
    ('question', 'context')
    >>> t.prefix(2).render({"question": "why?"})
    'Answer why?'
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Segment:
    """Either literal text or a variable (exactly one of the two)."""

    text: str = ""
    var: str | None = None


@dataclass(frozen=True)
class PromptTemplate:
    segments: tuple[Segment, ...]

    @classmethod
    def parse(cls, template: str) -> PromptTemplate:
        """Parse `str.format` syntax (`{name}`, `{{` for a brace)."""
        segments: list[Segment] = []
        for literal, field_name, format_spec, conversion in string.Formatter().parse(template):
            if literal:
                segments.append(Segment(text=literal))
            if field_name is not None:
                if not field_name.isidentifier() or format_spec or conversion:
                    raise ValueError(f"prompt template field {{{field_name}}} must be a plain name")
                segments.append(Segment(var=field_name))
        return cls(tuple(segments))

    @property
    def variables(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for seg in self.segments:
            if seg.var is not None:
                seen.setdefault(seg.var, None)
        return tuple(seen)

    def prefix(self, k: int) -> PromptTemplate:
        return PromptTemplate(self.segments[:k])

    def render(self, values: Mapping[str, Any]) -> str:
        parts = []
        for seg in self.segments:
            if seg.var is None:
                parts.append(seg.text)
            elif seg.var not in values:
                raise KeyError(f"prompt template needs variable {seg.var!r}")
            else:
                parts.append(str(values[seg.var]))
        return "".join(parts)


@dataclass(frozen=True)
class PromptPlan:
    """How a prompt is made, for a prompt step Teola does not compute itself.

    A framework's prompt object renders the prompt (so its own code and callbacks run);
    the plan says which template it renders and which node output each variable comes
    from (`sources`: variable -> (node id, port)), so prefill split can render and warm
    the ready start of the prompt while the rest is still being computed.
    """

    template: PromptTemplate
    sources: tuple[tuple[str, str, str], ...]  # (variable, node id, port)

    def source(self, variable: str) -> tuple[str, str] | None:
        for var, node, port in self.sources:
            if var == variable:
                return node, port
        return None
