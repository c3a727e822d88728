"""Simulated LLM for many agents: KV holds, decode output in the prefix cache, priority, stats."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from llm_nodes import decode_node, prefill_node

from teola_adapters.simulated import LLMStats, PrefixCache, SimClock, SimLLM, tokens_of
from teola_adapters.simulated.paper_profiles import LLM
from teola_adapters.simulated.prefix_cache import BLOCK_TOKENS
from teola_core.engines.protocol import Call
from teola_core.engines.retention import KVRetention
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.node import DecodePart
from teola_core.ir.split_units import Lines
from teola_core.ir.types import KVHandle
from teola_core.runtime.engine_free import decode_chunk


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


async def prefill(llm: SimLLM, prompt: str, **config: Any) -> KVHandle:
    return (await llm.run_one(Call("q", prefill_node(**config), {"prompt": prompt})))["kv"]


async def generate(llm: SimLLM, prompt: str, max_tokens: int = BLOCK_TOKENS) -> str:
    kv = await prefill(llm, prompt)
    return (await llm.run_one(Call("q", decode_node(max_tokens), {"kv": kv})))["text"]


async def prefill_delta(llm: SimLLM, prompt: str) -> LLMStats:
    """The stats of one prefill alone."""
    before = LLMStats(**vars(llm.stats))
    await prefill(llm, prompt)
    after = llm.stats
    return LLMStats(**{k: getattr(after, k) - v for k, v in vars(before).items()})


def test_sim_llm_is_a_kv_retention_engine() -> None:
    llm = SimLLM(LLM, time_scale=0)
    assert isinstance(llm, KVRetention)
    assert llm.reload_seconds(words("w", 100)) == LLM.latency("prefill", 100)
    with pytest.raises(ValueError, match="max_pinned_fraction"):
        SimLLM(LLM, max_pinned_fraction=1.5)


# -- 1. holds --------------------------------------------------------------------------
def test_a_hold_protects_a_returning_program_from_lru_churn_and_an_expired_one_does_not() -> None:
    """Cache of 8 blocks. Agent `a` prefills 48 tokens and writes 16: prompt + answer is
    4 whole blocks. While its tool runs, other agents push 8-block prompts through."""
    prompt = words("a", 48) + " "

    async def main(ttl_s: float | None) -> tuple[LLMStats, frozenset[str], frozenset[str]]:
        llm = SimLLM(LLM, time_scale=0, cache_tokens=8 * BLOCK_TOKENS)
        context = prompt + await generate(llm, prompt)
        assert len(tokens_of(context)) == 64
        if ttl_s is not None:
            assert llm.retain("a", context, ttl_s)
        held_before = llm.held_programs()
        for other in range(3):  # each takes ~0.04 s of simulated (busy) time at scale 0
            await generate(llm, words(f"o{other}x", 128), max_tokens=1)
        held_after = llm.held_programs()
        back = await prefill_delta(llm, context + " tool result " + words("r", 30))
        llm.release("a")
        return back, held_before, held_after

    kept, before, after = asyncio.run(main(ttl_s=60.0))
    assert before == after == {"a"}
    assert kept.cache_hit_tokens == 64 and kept.recomputed_tokens == 0 and kept.prefill_tokens == 32

    lost, _, _ = asyncio.run(main(ttl_s=None))  # no hold: LRU took the agent's blocks
    assert lost.cache_hit_tokens == 0 and lost.recomputed_tokens == 64

    expired, before, after = asyncio.run(main(ttl_s=0.01))  # shorter than the churn's simulated time
    assert before == {"a"} and after == frozenset()
    assert expired.cache_hit_tokens == 0 and expired.recomputed_tokens == 64


def test_holds_are_refused_beyond_the_pinned_fraction_and_share_blocks() -> None:
    async def main() -> None:
        llm = SimLLM(LLM, time_scale=0, cache_tokens=8 * BLOCK_TOKENS)  # at most 4 pinned blocks
        assert llm.max_pinned_blocks == 4
        a, b = words("a", 64), words("b", 64)
        await prefill(llm, a)
        await prefill(llm, b)
        assert llm.retain("a", a, 10.0) and llm.cache is not None and llm.cache.pinned_blocks == 4
        assert not llm.retain("b", b, 10.0)  # memory pressure: pins nothing
        assert llm.held_programs() == {"a"} and llm.cache.pinned_blocks == 4
        assert llm.retain("a2", a, 10.0)  # the same blocks: pinned (and counted) once
        assert llm.cache.pinned_blocks == 4 and llm.held_programs() == {"a", "a2"}
        llm.release("a")
        assert llm.cache.pinned_blocks == 4  # still held by a2
        llm.release("a2")
        llm.release("never-held")
        assert llm.cache.pinned_blocks == 0 and llm.held_programs() == frozenset()
        assert llm.retain("b", b, 10.0)

        # A refused or zero-ttl retain replaces the previous hold with nothing.
        assert not llm.retain("b", b, 0.0) and llm.held_programs() == frozenset()
        assert not llm.retain("b", b, math.nan) and llm.cache.pinned_blocks == 0
        half = words("b", 32)  # b's first two blocks
        assert llm.retain("b", half, 10.0) and llm.retain("x", words("a", 32), 10.0)
        assert not llm.retain("b", b, 10.0)  # 2 + 4 blocks: past the limit...
        assert llm.held_programs() == {"x"}  # ...and b's old hold is gone too

    asyncio.run(main())


def test_only_cached_blocks_are_pinned() -> None:
    async def main() -> None:
        llm = SimLLM(LLM, time_scale=0)
        assert llm.cache is not None
        assert not llm.retain("x", words("never", 64), 10.0)  # nothing cached: nothing to hold
        assert not llm.retain("x", "too short", 10.0)  # no whole block
        await prefill(llm, words("p", 40))  # two whole blocks cached
        assert llm.retain("x", words("p", 40) + " " + words("q", 40), 10.0)
        assert llm.cache.pinned_blocks == 2  # pinning computes nothing
        with pytest.raises(TypeError):
            llm.retain("x", ["not", "text"], 10.0)  # type: ignore[arg-type]
        off = SimLLM(LLM, time_scale=0, prefix_cache=False)
        await prefill(off, words("p", 40))
        assert not off.retain("x", words("p", 40), 10.0) and off.held_programs() == frozenset()

    asyncio.run(main())


def test_holds_expire_on_the_engine_clock() -> None:
    async def main() -> None:
        llm = SimLLM(LLM, time_scale=0)
        await prefill(llm, words("p", 64))
        assert llm.retain("x", words("p", 64), ttl_s=0.05) and llm.retain("y", words("p", 32), ttl_s=60)
        assert llm.held_programs() == {"x", "y"}
        await prefill(llm, words("z", 1000))  # ~0.26 s of simulated time
        assert llm.clock.now() == pytest.approx(llm.stats.busy_s)
        assert llm.held_programs() == {"y"}
        assert llm.cache is not None and llm.cache.pinned_blocks == 2

    asyncio.run(main())


def test_prefix_cache_holds_pass_over_pinned_blocks_and_expire_lazily() -> None:
    cache = PrefixCache(capacity_tokens=4 * BLOCK_TOKENS)
    a = cache.keys(words("a", 32).split())
    cache.use(a)
    assert cache.hold("a", a, until=5.0, max_pinned=2)
    for i in range(3):
        cache.use(cache.keys(words(f"o{i}x", 64).split()))  # 4 blocks each, into a 4-block cache
    assert cache.probe(a) == 2 and len(cache) == 4  # the others got the 2 free blocks
    cache.expire(now=4.0)
    assert cache.holders() == {"a"}
    cache.expire(now=5.0)
    assert cache.holders() == frozenset() and cache.probe(a) == 2  # unpinned, still cached
    cache.use(cache.keys(words("n", 64).split()))
    assert cache.probe(a) == 0 and all(cache.evicted(k) for k in a)


def test_dropped_holds_do_not_pile_up_deadlines() -> None:
    cache = PrefixCache(capacity_tokens=4 * BLOCK_TOKENS)
    a = cache.keys(words("a", 16).split())
    cache.use(a)
    for _ in range(1000):
        assert cache.hold("a", a, until=math.inf, max_pinned=1)
    cache.drop("a")
    assert len(cache._deadlines) <= 64 + 1


# -- 2. decode output enters the cache ------------------------------------------------
def test_a_finished_decode_caches_prompt_and_answer() -> None:
    prompt = words("p", 40) + " "

    async def main() -> tuple[str, LLMStats]:
        llm = SimLLM(LLM, time_scale=0)
        answer = await generate(llm, prompt, max_tokens=30)
        return answer, await prefill_delta(llm, prompt + answer + " next turn")

    answer, back = asyncio.run(main())
    context = len(tokens_of(prompt + answer))
    assert context == 70 and back.cache_hit_tokens == 64  # 4 whole blocks of prompt + answer
    assert back.prefill_tokens == context + 2 - 64


def test_streams_and_partial_decodes_cache_their_output_too() -> None:
    prompt = words("p", 40) + " "

    def lines(prompt: str, max_tokens: int) -> str:
        return "\n".join(words(f"line{i}w", 8) for i in range(4))  # 32 tokens

    async def streamed(llm: SimLLM) -> str:
        kv = await prefill(llm, prompt)
        return "".join([d async for d in llm.stream(Call("q", decode_node(64), {"kv": kv}))])

    async def partial(llm: SimLLM) -> str:
        kv = await prefill(llm, prompt)
        calls = [
            Call(
                "q",
                decode_node(64, PrimitiveKind.PARTIAL_DECODE, split_unit=Lines(), part=DecodePart("g", i, 2)),
                {"kv": kv},
            )
            for i in range(2)
        ]
        results = await llm.run(calls)
        assert [r["items"] for r in results] == [decode_chunk(Lines().parse(lines(prompt, 64)), i, 2) for i in range(2)]
        return results[0]["text"]

    async def main(how: Any) -> tuple[str, LLMStats]:
        llm = SimLLM(LLM, time_scale=0, responder=lines)
        text = await how(llm)
        return text, await prefill_delta(llm, prompt + text + "\nnext")

    for how in (streamed, partial):
        text, back = asyncio.run(main(how))
        assert text == lines(prompt, 64) and back.cache_hit_tokens == 64, how.__name__


def test_an_abandoned_stream_caches_what_it_produced() -> None:
    prompt = words("p", 32) + " "

    async def main() -> tuple[str, LLMStats]:
        llm = SimLLM(LLM, time_scale=0)
        kv = await prefill(llm, prompt)
        stream = llm.stream(Call("q", decode_node(200), {"kv": kv}))
        produced = ""
        async for delta in stream:
            produced += delta
            if len(tokens_of(produced)) == 20:
                break
        await stream.aclose()
        await generate(llm, "something else", 2)  # the step loop notices the closed stream
        return produced, await prefill_delta(llm, prompt + produced + " more")

    produced, back = asyncio.run(main())
    assert len(tokens_of(prompt + produced)) == 52 and back.cache_hit_tokens == 48


# -- 3. priority -----------------------------------------------------------------------
def test_waiting_prefills_are_admitted_by_priority_then_arrival() -> None:
    priorities = {"a": 5, "b": 1, "c": 3, "d": 1, "e": 0, "f": 2.5}

    async def main(max_step_tokens: int) -> tuple[list[str], list[Any]]:
        llm = SimLLM(LLM, time_scale=0, max_step_tokens=max_step_tokens)
        order: list[str] = []

        async def one(name: str, priority: float) -> Any:
            result = await llm.run_one(Call(name, prefill_node(priority=priority), {"prompt": words(name, 20)}))
            order.append(name)
            return result

        results = await asyncio.gather(*(one(n, p) for n, p in priorities.items()))
        return order, results

    order, results = asyncio.run(main(max_step_tokens=1))  # one prefill per step
    assert order == ["e", "b", "d", "f", "c", "a"]
    _, together = asyncio.run(main(max_step_tokens=8192))  # all in one step: same outputs
    assert results == together == [{"kv": KVHandle("llm", words(n, 20))} for n in priorities]


def test_a_priority_that_is_not_a_number_fails_its_call() -> None:
    async def main() -> list[Any]:
        llm = SimLLM(LLM, time_scale=0)
        return await llm.run(
            [
                Call("q", prefill_node(priority="high"), {"prompt": "x"}),
                Call("q", prefill_node(priority=math.nan), {"prompt": "x"}),
                Call("q", prefill_node(), {"prompt": "x"}),
            ]
        )

    bad, nan, good = asyncio.run(main())
    assert isinstance(bad, TypeError) and isinstance(nan, ValueError) and good == {"kv": KVHandle("llm", "x")}


# -- 4. stats --------------------------------------------------------------------------
def test_recomputed_tokens_count_only_blocks_computed_again_after_eviction() -> None:
    async def main() -> tuple[LLMStats, LLMStats, LLMStats, LLMStats]:
        llm = SimLLM(LLM, time_scale=0, cache_tokens=4 * BLOCK_TOKENS)
        first = await prefill_delta(llm, words("a", 70))  # 4 whole blocks + 6
        await prefill_delta(llm, words("b", 64))  # evicts all of a's
        again = await prefill_delta(llm, words("a", 70))
        warm = await prefill_delta(llm, words("a", 64))  # cached; the last block recomputes for logits
        full = SimLLM(LLM, time_scale=0, cache_tokens=4 * BLOCK_TOKENS)
        part = prefill_node(PrimitiveKind.PARTIAL_PREFILL)
        kv = (await full.run_one(Call("q", part, {"prefix": words("a", 24)})))["kv"]
        await prefill(full, words("c", 64))  # evicts a's one block
        await full.run_one(
            Call("q", prefill_node(PrimitiveKind.FULL_PREFILL), {"prompt": words("a", 40), "prefix_kv": kv})
        )
        return first, again, warm, full.stats

    first, again, warm, full = asyncio.run(main())
    assert first.recomputed_tokens == 0 and first.prefill_tokens == 70
    assert again.recomputed_tokens == 64 and again.prefill_tokens == 70
    assert warm.recomputed_tokens == 0 and warm.prefill_tokens == 16
    assert full.handle_hit_tokens == 24 and full.recomputed_tokens == 0  # the handle held what was evicted


def test_prefix_hit_rate() -> None:
    assert LLMStats().prefix_hit_rate == 0.0
    assert LLMStats(prompt_tokens=100, cache_hit_tokens=48, handle_hit_tokens=2).prefix_hit_rate == 0.5

    async def main() -> LLMStats:
        llm = SimLLM(LLM, time_scale=0)
        await prefill(llm, words("s", 40))
        await prefill(llm, words("s", 40) + " tail")
        return llm.stats

    s = asyncio.run(main())
    assert s.prompt_tokens == 81 and s.prefix_hit_rate == pytest.approx(32 / 81)


# -- the clock -------------------------------------------------------------------------
def test_sim_clock_now_is_spent_time_at_scale_zero_and_scaled_wall_time_otherwise() -> None:
    async def main() -> tuple[float, float]:
        still, paced = SimClock(0), SimClock(0.001)
        await still.spend(2.5)
        await paced.spend(0.5)  # sleeps 0.5 ms
        return still.now(), paced.now()

    still, paced = asyncio.run(main())
    assert still == 2.5 and paced >= 0.49


def test_a_hold_at_a_positive_time_scale_lasts_its_ttl_in_scaled_wall_time() -> None:
    async def main() -> tuple[frozenset[str], frozenset[str]]:
        llm = SimLLM(LLM, time_scale=0.001)
        await prefill(llm, words("p", 64))
        assert llm.retain("long", words("p", 64), ttl_s=3600) and llm.retain("short", words("p", 32), ttl_s=2.0)
        early = llm.held_programs()  # 2 s simulated is 2 ms of wall time
        await generate(llm, "decode for a while", 200)  # ~5 s simulated: at least 5 ms of wall time
        return early, llm.held_programs()

    early, late = asyncio.run(main())
    assert early == {"long", "short"} and late == {"long"}
