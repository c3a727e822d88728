"""KV retention for agents on the llama.cpp engine (`KVRetention`), and the StateCache's holds.

An agent's next call extends its last prompt with the model's answer and a tool result.
Retained, the last prompt's state survives other agents' calls, and the next prefill
evaluates only from the last prompt's last whole chunk on; the texts are exactly those
of evaluating every prompt from scratch (and of `create_completion`).
"""

from __future__ import annotations

import importlib.util

import pytest
from engine_testkit import node, run

from teola_adapters._llm import common_prefix
from teola_adapters.llamacpp import SavedState, StateCache
from teola_core.engines.protocol import Call
from teola_core.engines.retention import KVRetention
from teola_core.ir.kinds import PrimitiveKind

K = PrimitiveKind
needs_model = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason='needs "teola[local]"')
pytestmark = pytest.mark.llamacpp  # a native crash fails these tests by name (tests/conftest.py)

SYSTEM = (
    "<|im_start|>system\nYou are an agent with tools. To call a tool, write CALL tool_name(arguments) and "
    "stop; the tool's result comes back in a tool message. Answer the user once you know enough.<|im_end|>\n"
)
TASK = "<|im_start|>user\nHow many people live in Paris and in Lyon together?<|im_end|>\n<|im_start|>assistant\n"
TOOL_RESULTS = (
    "population(Paris) = 2,102,650 inhabitants (2023 census).",
    "population(Lyon) = 522,250 inhabitants (2023 census).",
)
OTHERS = (  # other agents' prompts, run while this one's tool runs
    "<|im_start|>system\nYou summarize logs.<|im_end|>\n<|im_start|>user\n"
    + " ".join(f"line {i}: request {i * 7} served in {i % 5} ms." for i in range(6))
    + "<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou translate to French.<|im_end|>\n<|im_start|>user\n"
    + " ".join(f"Sentence {i}: the {w} is on the table." for i, w in enumerate(("cat", "book", "cup") * 2))
    + "<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou answer trivia.<|im_end|>\n<|im_start|>user\n"
    + " ".join(f"Question {i}: what is {i} plus {i * 3}?" for i in range(7))
    + "<|im_end|>\n<|im_start|>assistant\n",
)


class Clock:
    """The engine's clock, advanced by hand: holds expire without sleeping."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# -- the StateCache's holds (no model) ------------------------------------------------------
def _state(tokens: tuple[int, ...], nbytes: int = 100) -> SavedState:
    return SavedState(tokens, None, nbytes, None)


def test_a_held_state_survives_eviction_until_released_or_expired() -> None:
    clock = Clock()
    cache = StateCache(300, hold_bytes=150, clock=clock)
    cache.put(_state((1, 2, 3, 4)))
    assert cache.hold("agent", [1, 2, 3, 4, 5, 6], chunk=2, ttl_s=5) == 4  # tokens it serves
    assert cache.holders() == {"agent"} and cache.held_bytes == 100
    for i in range(5):  # others fill the cache: the held state stays, unheld ones go LRU
        cache.put(_state((9, i)))
    assert (1, 2, 3, 4) in cache and cache.nbytes == 300
    clock.advance(5)
    assert cache.holders() == frozenset()
    cache.put(_state((8, 0)))
    assert (1, 2, 3, 4) not in cache  # expired: evicted like any other (it was the least recent)

    cache.put(_state((1, 2, 3, 4)))
    assert cache.hold("agent", [1, 2, 3, 4], chunk=2, ttl_s=5) == 4
    cache.release("agent")
    assert cache.holders() == frozenset() and cache.held_bytes == 0


def test_holds_beyond_the_hold_budget_are_refused() -> None:
    cache = StateCache(1000, hold_bytes=250, clock=Clock())
    for first in (1, 2, 3):
        cache.put(_state((first, 0)))
    assert cache.hold("a", [1, 0, 7], chunk=1, ttl_s=1) == 2
    assert cache.hold("b", [2, 0, 7], chunk=1, ttl_s=1) == 2
    assert cache.hold("c", [3, 0, 7], chunk=1, ttl_s=1) == 0  # 300 bytes > 250: refused
    assert cache.hold("c", [1, 0], chunk=1, ttl_s=1) == 2  # a state already held costs nothing more
    assert cache.hold("d", [5, 5], chunk=1, ttl_s=1) == 0  # nothing serves it
    assert cache.hold("a", [1, 0], chunk=1, ttl_s=0) == 0  # ttl <= 0: refused, and a's hold is gone
    assert cache.holders() == {"b", "c"}


def test_a_hold_replaces_the_programs_previous_one() -> None:
    cache = StateCache(1000, hold_bytes=150, clock=Clock())
    cache.put(_state((1, 0)))
    cache.put(_state((2, 0)))
    assert cache.hold("a", [1, 0], chunk=1, ttl_s=1) == 2
    assert cache.hold("a", [2, 0], chunk=1, ttl_s=1) == 2  # fits: the first hold was dropped
    assert cache.held_bytes == 100


def test_a_state_that_does_not_fit_beside_the_holds_is_not_kept() -> None:
    cache = StateCache(300, hold_bytes=200, clock=Clock())
    cache.put(_state((1,), 200))
    assert cache.hold("a", [1], chunk=1, ttl_s=1) == 1
    cache.put(_state((2,), 150))  # 150 > 300 - 200: it would evict everything unheld for nothing
    assert (2,) not in cache and (1,) in cache and cache.nbytes == 200


def test_a_consumed_prompt_is_evicted_first() -> None:
    cache = StateCache(300)
    for key in ((1,), (2,), (3,)):
        cache.put(_state(key))
    cache.demote((3,))
    cache.put(_state((4,)))
    assert (3,) not in cache and (1,) in cache


# -- the engine ------------------------------------------------------------------------------
def _engine(clock: Clock, **options):
    from teola_adapters.llamacpp import LlamaCppEngine

    # Two sequences (other agents' prompts take both) and room for about 260 tokens' states
    # (23 KB a token), half of it for holds: without a hold, an agent's state is gone when it returns.
    # One thread: robust to a busy machine.
    options = {"max_sequences": 1, "cache_bytes": 6 * 2**20, "n_threads": 1, **options}
    return LlamaCppEngine(clock=clock, **options)


async def _call(engine, prompt: str, max_tokens: int = 24) -> tuple[str, int]:
    """PREFILL + DECODE; the text and the prompt tokens the prefill evaluated."""
    before = engine.stats.computed_tokens
    kv = (await engine.run_one(Call("agent", node(K.PREFILL, engine.name), {"prompt": prompt})))["kv"]
    evaluated = engine.stats.computed_tokens - before
    text = (await engine.run_one(Call("agent", node(K.DECODE, engine.name, max_tokens=max_tokens), {"kv": kv})))["text"]
    return text, evaluated


async def _agent(engine, clock: Clock, *, ttl_s: float, tool_s: float = 1.0) -> dict[str, list]:
    """Three model calls with two tool calls between them, other agents' calls during each tool.

    Returns each call's prompt, answer, and prompt tokens evaluated, and whether each hold was kept.
    """
    prompt = SYSTEM + TASK
    seen: dict[str, list] = {"prompts": [], "answers": [], "evaluated": [], "kept": []}
    for turn in range(3):
        answer, evaluated = await _call(engine, prompt)
        engine.release("agent")  # back: its call holds the KV now
        seen["prompts"].append(prompt)
        seen["answers"].append(answer)
        seen["evaluated"].append(evaluated)
        if turn == 2:
            break
        seen["kept"].append(engine.retain("agent", prompt + answer, ttl_s=ttl_s))
        for other in OTHERS:  # the tool runs; other agents use the engine meanwhile
            clock.advance(tool_s / len(OTHERS))
            await _call(engine, other, max_tokens=4)
        prompt += answer + f"<|im_end|>\n<|im_start|>tool\n{TOOL_RESULTS[turn]}<|im_end|>\n<|im_start|>assistant\n"
    return seen


@needs_model
def test_an_agent_with_retention_evaluates_only_the_new_tokens_and_answers_the_same(reference) -> None:
    clock = Clock()
    held, plain = _engine(clock), _engine(clock)
    try:
        assert isinstance(held, KVRetention)
        kept = run(_agent(held, clock, ttl_s=5.0), timeout=180)
        dropped = run(_agent(plain, clock, ttl_s=0.0), timeout=180)  # a TTL of 0: no hold
        tokens = [held.tokenize(p) for p in kept["prompts"]]
    finally:
        run(held.close())
        run(plain.close())
    # The same conversation, and every answer is create_completion's on its whole prompt.
    assert kept["prompts"] == dropped["prompts"] and kept["answers"] == dropped["answers"]
    assert kept["answers"] == [reference(p, 24) for p in kept["prompts"]]
    assert all(a.strip() for a in kept["answers"])
    assert kept["kept"] == [True, True] and dropped["kept"] == [False, False]
    # Without a hold every call evaluates its whole prompt (the others took the room and the sequences).
    assert dropped["evaluated"] == [len(t) for t in tokens]
    # With it, the next call evaluates only from the last prompt's last whole chunk on.
    assert kept["evaluated"][0] == len(tokens[0])
    for turn in (1, 2):
        reused = common_prefix(tokens[turn - 1], tokens[turn]) // 32 * 32
        assert reused >= len(tokens[turn - 1]) - 32
        assert kept["evaluated"][turn] == len(tokens[turn]) - reused
    assert sum(kept["evaluated"][1:]) < sum(dropped["evaluated"][1:]) / 2


@needs_model
def test_expired_and_refused_holds_still_give_the_right_answers(reference) -> None:
    clock = Clock()
    expired, refused = _engine(clock), _engine(clock, hold_bytes=0)
    try:
        # The tool takes 3 s, the hold lasts 2 s: gone when the agent comes back.
        late = run(_agent(expired, clock, ttl_s=2.0, tool_s=3.0), timeout=180)
        # No room for holds at all: refused, nothing held.
        none = run(_agent(refused, clock, ttl_s=5.0), timeout=180)
        whole = [expired.count_tokens(p) for p in late["prompts"]]
    finally:
        run(expired.close())
        run(refused.close())
    assert late["kept"] == [True, True] and none["kept"] == [False, False]
    assert late["prompts"] == none["prompts"] and late["answers"] == none["answers"]
    assert late["answers"] == [reference(p, 24) for p in late["prompts"]]
    assert late["evaluated"] == none["evaluated"] == whole  # every prompt recomputed whole, in both


@needs_model
def test_held_programs_lists_holds_in_force_on_the_engine_clock() -> None:
    clock = Clock()
    engine = _engine(clock)
    try:
        text, _ = run(_call(engine, SYSTEM + TASK))
        prompt = SYSTEM + TASK + text
        assert engine.retain("a", prompt, ttl_s=2.0) and engine.retain("b", prompt, ttl_s=5.0)
        assert engine.held_programs() == {"a", "b"}
        clock.advance(2.0)
        assert engine.held_programs() == {"b"}
        engine.release("b")
        assert engine.held_programs() == frozenset()
        assert not engine.retain("c", prompt, ttl_s=0)
        # What the agent runtime weighs a hold against: re-prefilling the text (profiled).
        reload_s = engine.reload_seconds(prompt)
        assert reload_s == engine.profile.latency("prefill", engine.count_tokens(prompt)) and reload_s > 0
        assert not engine.retain("d", "A text no saved state shares a whole chunk with.", ttl_s=5.0)
    finally:
        run(engine.close())
