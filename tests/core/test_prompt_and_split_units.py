"""Prompt templates render prefixes causally; split units parse incrementally = whole."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from teola_core.ir.prompt import PromptTemplate
from teola_core.ir.split_units import JsonArray, Lines


def test_prefix_rendering_is_a_prefix_of_the_full_prompt() -> None:
    t = PromptTemplate.parse("System: be brief.\nQ: {question}\nContext: {context}\nA:")
    assert t.variables == ("question", "context")
    full = t.render({"question": "why", "context": "because"})
    for k in range(len(t.segments) + 1):
        values = {"question": "why", "context": "because"}
        needed = set(t.prefix(k).variables)
        assert full.startswith(t.prefix(k).render({v: values[v] for v in needed}))


def test_template_rejects_non_plain_fields() -> None:
    with pytest.raises(ValueError, match="plain name"):
        PromptTemplate.parse("{a.b}")


def test_render_names_a_missing_variable() -> None:
    with pytest.raises(KeyError, match="context"):
        PromptTemplate.parse("{context}").render({})


def _cuts(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    pieces, last = [], 0
    for p in points:
        pieces.append(text[last:p])
        last = p
    pieces.append(text[last:])
    return pieces


@given(st.lists(st.text(alphabet="ab \n", max_size=8), max_size=8), st.lists(st.integers(0, 60), max_size=6))
def test_lines_incremental_equals_parse(lines: list[str], cuts: list[int]) -> None:
    text = "\n".join(lines)
    parser = Lines().parser()
    items = [i for piece in _cuts(text, cuts) for i in parser.feed(piece)] + parser.close()
    assert items == Lines().parse(text)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab"\\,[]{} ', max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet="ab", max_size=2), inner, max_size=2),
    max_leaves=6,
)


@given(st.lists(json_values, max_size=5), st.lists(st.integers(0, 80), max_size=6), st.booleans())
def test_json_array_incremental_equals_parse(values: list[object], cuts: list[int], pretty: bool) -> None:
    text = json.dumps(values, indent=2 if pretty else None)
    parser = JsonArray().parser()
    items = [i for piece in _cuts(text, cuts) for i in parser.feed(piece)] + parser.close()
    assert items == JsonArray().parse(text) == values


def test_json_array_items_arrive_before_the_end() -> None:
    parser = JsonArray().parser()
    assert parser.feed('["first", {"a": [1, 2]}') == ["first"]
    assert parser.feed(", 3") == [{"a": [1, 2]}]
    assert parser.feed("]") == [3]
    assert parser.close() == []


def test_truncated_json_array_fails_at_close_like_parse() -> None:
    parser = JsonArray().parser()
    parser.feed('["a", "b"')
    with pytest.raises(ValueError):
        parser.close()
