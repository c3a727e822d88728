"""Several decodes per llama_decode on the llama.cpp engine: the texts of decoding alone.

Running decodes advance together, one token each per step, joining and leaving as they
come and go; each gives exactly llama.cpp's own `create_completion` text (greedy, and
sampled with a seed), streamed or not.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

pytest.importorskip("llama_cpp")

from engine_testkit import node, run

from teola_adapters.llamacpp import LlamaCppEngine
from teola_adapters.llamacpp.worker import WorkDone
from teola_core.engines.protocol import Call
from teola_core.ir.kinds import PrimitiveKind

pytestmark = pytest.mark.llamacpp  # a native crash fails these tests by name (tests/conftest.py)

K = PrimitiveKind
QUESTIONS = (
    "What is the capital of France?",
    "List three colours, one per line.",
    "Write a haiku about rivers.",
    "Explain recursion to a child in two sentences.",
    "Count from one to ten in words.",
    "Give me a recipe for pancakes.",
)


def chat(question: str, system: str = "You are a helpful assistant.") -> str:
    return f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture
def engine():
    e = LlamaCppEngine(max_sequences=4, n_threads=1)  # one thread: robust to a busy machine
    yield e
    run(e.close())


async def _prefill(engine: LlamaCppEngine, prompt: str):
    return (await engine.run_one(Call("q", node(K.PREFILL, engine.name), {"prompt": prompt})))["kv"]


async def _generate(engine: LlamaCppEngine, prompt: str, max_tokens: int, **config) -> str:
    kv = await _prefill(engine, prompt)
    decode = node(K.DECODE, engine.name, max_tokens=max_tokens, **config)
    return (await engine.run_one(Call("q", decode, {"kv": kv})))["text"]


def test_limits_let_the_scheduler_keep_every_sequence_busy(engine) -> None:
    assert engine.limits.max_batch_items == 1  # a call returns when it is done
    assert engine.limits.concurrency == 2 * engine.max_sequences  # running decodes, and as many waiting


def test_concurrent_decodes_share_steps_and_give_the_texts_of_decoding_alone(engine, reference) -> None:
    """Six decodes on four sequences, of different lengths: they join and leave at different steps."""
    lengths = (8, 24, 12, 32, 16, 20)
    prompts = [chat(q) for q in QUESTIONS]

    async def main() -> list[str]:
        kvs = [await _prefill(engine, p) for p in prompts]
        calls = [
            Call("q", node(K.DECODE, engine.name, max_tokens=n), {"kv": kv}) for kv, n in zip(kvs, lengths, strict=True)
        ]
        return [outputs["text"] for outputs in await engine.run(calls)]

    texts = run(main(), timeout=180)
    assert texts == [reference(p, n) for p, n in zip(prompts, lengths, strict=True)]
    assert all(t.strip() for t in texts)
    stats = engine.stats
    assert stats.decodes == 6 and stats.decode_tokens <= sum(lengths)
    assert stats.decode_tokens / stats.decode_steps > 2  # several sequences per llama_decode


def test_prefills_run_between_the_steps_of_running_decodes(engine, reference) -> None:
    """Each query's prefill then decode, all at once: later prefills run while decodes advance."""
    prompts = [chat(q, system="Answer in one short paragraph.") for q in QUESTIONS[:5]]

    async def main() -> list[str]:
        return list(await asyncio.gather(*(_generate(engine, p, 16) for p in prompts)))

    assert run(main(), timeout=180) == [reference(p, 16) for p in prompts]


def test_greedy_sampled_and_streamed_decodes_run_together(engine, reference) -> None:
    prompts = [chat(q) for q in QUESTIONS[:4]]
    sampling = {"temperature": 0.9, "seed": 7, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.1}

    async def streamed(prompt: str) -> list[str]:
        kv = await _prefill(engine, prompt)
        decode = node(K.DECODE, engine.name, max_tokens=20)
        return [delta async for delta in engine.stream(Call("q", decode, {"kv": kv}))]

    async def main() -> tuple:
        return await asyncio.gather(
            _generate(engine, prompts[0], 20),
            _generate(engine, prompts[1], 20, **sampling),
            streamed(prompts[2]),
            _generate(engine, prompts[3], 20, stop=["\n"]),
        )

    greedy, sampled, deltas, stopped = run(main(), timeout=180)
    assert greedy == reference(prompts[0], 20)
    assert sampled == reference(prompts[1], 20, **sampling)
    assert len(deltas) > 1 and "".join(deltas) == reference(prompts[2], 20)
    assert stopped == reference(prompts[3], 20, stop=["\n"])


def test_decodes_leaving_early_do_not_change_the_others(reference) -> None:
    """A stream closed after its first delta and a cancelled call: the others' texts stay exact."""
    prompts = [chat(q) for q in QUESTIONS[:4]]
    loops: list[asyncio.AbstractEventLoop] = []
    stepped = asyncio.Event()  # the call to cancel has had a decode step on the worker

    def on_work(done: WorkDone) -> None:  # on the worker thread
        if done.kind == "decode" and any(c.query_id == "gone" for c in done.calls):
            loops[0].call_soon_threadsafe(stepped.set)

    engine = LlamaCppEngine(max_sequences=4, n_threads=1, on_work=on_work)  # one thread: robust to a busy machine

    async def main() -> list[str]:
        loops.append(asyncio.get_running_loop())
        others = [asyncio.create_task(_generate(engine, p, 24)) for p in prompts[:2]]
        long = node(K.DECODE, engine.name, max_tokens=200)
        kv_cancelled, kv_streamed = await _prefill(engine, prompts[2]), await _prefill(engine, prompts[3])
        cancelled = asyncio.create_task(engine.run_one(Call("gone", long, {"kv": kv_cancelled})))
        await stepped.wait()  # its decode is running on the worker
        agen = engine.stream(Call("q", long, {"kv": kv_streamed}))
        assert await anext(agen)  # so both are running now
        cancelled.cancel()
        await agen.aclose()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        return list(await asyncio.gather(*others))

    try:
        texts = run(main(), timeout=180)
        assert texts == [reference(p, 24) for p in prompts[:2]]
        assert engine.stats.decode_tokens < 2 * 24 + 2 * 200
        assert run(_generate(engine, prompts[2], 12)) == reference(prompts[2], 12)  # the engine goes on
    finally:
        run(engine.close())


def test_one_decode_a_step_earliest_query_first_gives_the_same_texts(reference) -> None:
    """decode_batch=1: every step advances one sequence, the earliest query's until it is done;
    the texts are those of all decodes stepping together (and of decoding alone)."""
    prompts = [chat(q) for q in QUESTIONS[:4]]
    lengths = (12, 20, 8, 16)
    done: list[str] = []
    work: list = []
    engine = LlamaCppEngine(max_sequences=4, n_threads=1, on_work=work.append)

    async def one(query: str, prompt: str, n: int, cap: int) -> str:
        kv = (await engine.run([Call(query, node(K.PREFILL, engine.name), {"prompt": prompt})], decode_batch=cap))[0]
        decode = node(K.DECODE, engine.name, max_tokens=n)
        (out,) = await engine.run([Call(query, decode, {"kv": kv["kv"]})], decode_batch=cap)
        done.append(query)
        return out["text"]

    async def main(cap: int, tag: str) -> list[str]:
        done.clear()
        work.clear()
        pairs = enumerate(zip(prompts, lengths, strict=True))
        return list(await asyncio.gather(*(one(f"{tag}{i}", p, n, cap) for i, (p, n) in pairs)))

    try:
        alone = run(main(1, "a"), timeout=180)
        steps = [w for w in work if w.kind == "decode"]
        order = list(done)
        together = run(main(4, "t"), timeout=180)
        batched = [w for w in work if w.kind == "decode"]
    finally:
        run(engine.close())
    assert alone == together == [reference(p, n) for p, n in zip(prompts, lengths, strict=True)]
    assert max(len(w.calls) for w in steps) == 1 and max(len(w.calls) for w in batched) == 4
    assert order == ["a0", "a1", "a2", "a3"]  # the queries as they came, whatever their lengths
    first_of = [next(i for i, w in enumerate(steps) if w.calls[0].query_id == f"a{q}") for q in range(4)]
    last_of = [max(i for i, w in enumerate(steps) if w.calls[0].query_id == f"a{q}") for q in range(4)]
    assert all(last_of[q] < first_of[q + 1] for q in range(3))  # one query's decode at a time


def test_an_earlier_query_decodes_between_the_chunks_of_a_later_prompt(reference) -> None:
    """A long prompt of a later query is evaluated a chunk at a time: the earlier query's decode
    steps in between (its text unchanged), and the long prompt's decode is exact too."""
    engine, work, started = _engine_watching("later")
    early, long = chat(QUESTIONS[0]), chat(" ".join(QUESTIONS) * 6, system="Summarize.")
    assert engine.count_tokens(long) > 6 * engine.chunk

    async def main() -> tuple[str, str]:
        kv = (await engine.run([Call("early", node(K.PREFILL, engine.name), {"prompt": early})], decode_batch=1))[0]
        later = asyncio.create_task(_generate_as(engine, "later", long, 4))
        await asyncio.to_thread(started.wait)  # its first chunk is evaluated
        decode = node(K.DECODE, engine.name, max_tokens=16)
        (out,) = await engine.run([Call("early", decode, {"kv": kv["kv"]})], decode_batch=1)
        return out["text"], await later

    try:
        text, later_text = run(main(), timeout=180)
    finally:
        run(engine.close())
    assert text == reference(early, 16) and later_text == reference(long, 4)
    kinds = [(w.kind, w.calls[0].query_id) for w in work if w.calls]
    first_step = kinds.index(("decode", "early"))
    assert ("prefill", "later") in kinds[first_step:]  # the long prompt was not done when the decode began


def _engine_watching(query: str) -> tuple[LlamaCppEngine, list[WorkDone], threading.Event]:
    """An engine of two sequences recording its work, and an event set once `query`'s prompt
    has evaluated a chunk."""
    started = threading.Event()
    work: list[WorkDone] = []

    def seen(done: WorkDone) -> None:
        work.append(done)
        if done.kind == "prefill" and done.calls[0].query_id == query:
            started.set()

    return LlamaCppEngine(max_sequences=2, n_threads=1, on_work=seen), work, started


async def _generate_as(engine: LlamaCppEngine, query: str, prompt: str, max_tokens: int) -> str:
    (kv,) = await engine.run([Call(query, node(K.PREFILL, engine.name), {"prompt": prompt})], decode_batch=1)
    decode = node(K.DECODE, engine.name, max_tokens=max_tokens)
    (out,) = await engine.run([Call(query, decode, {"kv": kv["kv"]})], decode_batch=1)
    return out["text"]


def test_an_earlier_querys_prompt_goes_ahead_of_a_later_one_begun_first(reference) -> None:
    """A later question's prompt reached the engine first and began: the earlier question's
    prompt (earlier arrival) runs ahead of its remaining chunks, while the begun one keeps its
    sequence; both prompts' decodes are exact."""
    engine, work, started = _engine_watching("later")
    first, second = chat(" ".join(QUESTIONS) * 5, system="Summarize."), chat(" ".join(QUESTIONS[::-1]) * 5)
    assert min(engine.count_tokens(first), engine.count_tokens(second)) > 5 * engine.chunk

    async def prompt_of(query: str, prompt: str, arrival: float) -> str:
        call = Call(query, node(K.PREFILL, engine.name), {"prompt": prompt}, arrival=arrival)
        (kv,) = await engine.run([call], decode_batch=1)
        decode = node(K.DECODE, engine.name, max_tokens=4)
        (out,) = await engine.run([Call(query, decode, {"kv": kv["kv"]}, arrival=arrival)], decode_batch=1)
        return out["text"]

    async def main() -> tuple[str, str]:
        later = asyncio.create_task(prompt_of("later", second, arrival=2.0))
        await asyncio.to_thread(started.wait)  # its first chunk is evaluated
        return await prompt_of("earlier", first, arrival=1.0), await later

    try:
        earlier_text, later_text = run(main(), timeout=180)
    finally:
        run(engine.close())
    assert earlier_text == reference(first, 4) and later_text == reference(second, 4)
    prefills = [w.calls[0].query_id for w in work if w.kind == "prefill" and w.calls]
    # after its first chunk the later prompt waited for the whole earlier prompt, then resumed
    assert prefills[0] == "later" and "earlier" in prefills
    resumed = prefills.index("earlier") + prefills[prefills.index("earlier") :].index("later")
    assert set(prefills[prefills.index("earlier") : resumed]) == {"earlier"}
    assert prefills[resumed:] == ["later"] * (len(prefills) - resumed)
