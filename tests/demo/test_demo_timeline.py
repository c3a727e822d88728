"""The demo's timeline: llama.cpp work by question, engine calls joined, one picture (no engines)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from teola.demo.timeline import Bar, Run, _answer_labels, call_bars, draw, llama_bars, question_of

QUESTIONS = ["What does functools.lru_cache do?", "How do I parse command-line arguments?"]


@dataclass(frozen=True)
class FakeCall:
    inputs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Kv:
    prompt: str


@dataclass(frozen=True)
class Done:
    kind: str
    began: float
    ended: float
    calls: tuple[FakeCall, ...]


def prompt(q: int) -> FakeCall:
    return FakeCall({"prompt": f"<|im_start|>user\nQuestion: {QUESTIONS[q]}<|im_end|>"})


def decode(q: int) -> FakeCall:
    return FakeCall({"kv": Kv(f"...{QUESTIONS[q]}...")})


def test_a_call_belongs_to_the_question_its_prompt_quotes() -> None:
    assert question_of(prompt(1), QUESTIONS) == 1
    assert question_of(decode(0), QUESTIONS) == 0
    assert question_of(FakeCall({"prefix": "system only"}), QUESTIONS) is None


def test_runs_of_the_same_work_merge_and_steps_of_several_questions_keep_them_all() -> None:
    work = [
        Done("prefill", 0.5, 0.9, (prompt(0),)),  # before the run: left out
        Done("prefill", 10.0, 10.2, (prompt(0),)),
        Done("prefill", 10.2005, 10.4, (prompt(0),)),
        Done("decode", 10.4, 10.5, (decode(0), decode(1))),
        Done("decode", 10.5, 10.6, (decode(1), decode(0))),
        Done("decode", 10.6, 10.7, (decode(1),)),
    ]
    bars = llama_bars(work, 10.0, QUESTIONS)
    assert [(b.kind, b.questions) for b in bars] == [("prefill", (0,)), ("decode", (0, 1)), ("decode", (1,))]
    assert bars[0].began == 0.0 and bars[0].ended == pytest.approx(0.4) and bars[1].ended == pytest.approx(0.6)


def test_overlapping_calls_of_one_engine_join_into_one_busy_bar() -> None:
    calls = [("embed", 10.1, 10.3), ("embed", 10.2, 10.4), ("search", 10.3, 10.35), ("embed", 11.0, 11.1)]
    bars = call_bars([*calls, ("embed", 20.0, 20.1)], 10.0, 12.0)
    assert [(b.lane, round(b.began, 2), round(b.ended, 2)) for b in bars] == [
        ("embed", 0.1, 0.4),
        ("search", 0.3, 0.35),
        ("embed", 1.0, 1.1),
    ]


def test_answers_at_the_same_time_share_one_label() -> None:
    assert _answer_labels([5.0, 5.01, 9.0], close=0.2) == [(5.0, "Q1, Q2"), (9.0, "Q3")]


def test_the_picture_has_both_runs_on_one_time_axis(tmp_path) -> None:
    bars = [Bar("llama", 0.0, 1.0, "prefill", (0,)), Bar("llama", 1.0, 2.0, "decode", (0, 1))]
    bars.append(Bar("embed", 1.2, 1.3, "embed"))
    runs = [Run("plain LangChain", bars, [2.0, 2.0], 2.0), Run("teola.optimize", bars[:1], [1.0, 1.5], 1.5)]
    path = draw(runs, QUESTIONS, "title", tmp_path / "t.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
