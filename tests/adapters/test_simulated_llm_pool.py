"""The simulated LLM's KV-pool mode: running requests take room, prefills wait for it.

Driven on the virtual-time loop, so waits cost no wall time and every figure is exact.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from teola_adapters.simulated import SimLLM
from teola_adapters.simulated.paper_profiles import LLM
from teola_adapters.simulated.prefix_cache import BLOCK_TOKENS
from teola_adapters.simulated.virtual_time import run_virtual
from teola_core.engines.protocol import Call
from teola_core.ir.kinds import Capabilities, PortSpec, PrimitiveKind, spec_of
from teola_core.ir.node import Node
from teola_core.ir.types import KVHandle, PortType


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def _prefill_node(**config: Any) -> Node:
    spec = spec_of(PrimitiveKind.PREFILL)
    assert spec.inputs is not None and spec.outputs is not None
    return Node(
        "prefill", PrimitiveKind.PREFILL, spec.inputs, spec.outputs, engine="llm", config=config, caps=spec.caps
    )


def _decode_node(max_tokens: int) -> Node:
    return Node(
        "decode",
        PrimitiveKind.DECODE,
        (PortSpec("kv", PortType.KV),),
        (PortSpec("text", PortType.TEXT),),
        engine="llm",
        config={"max_tokens": max_tokens},
        caps=Capabilities(batchable=True),
    )


async def _prefill(llm: SimLLM, prompt: str, **config: Any) -> KVHandle:
    return (await llm.run_one(Call("q", _prefill_node(**config), {"prompt": prompt})))["kv"]


async def _decode(llm: SimLLM, kv: KVHandle, max_tokens: int) -> str:
    return (await llm.run_one(Call("q", _decode_node(max_tokens), {"kv": kv})))["text"]


def test_a_prefill_waits_until_a_running_sequence_frees_its_blocks() -> None:
    async def main() -> tuple[float, float, int]:
        loop = asyncio.get_running_loop()
        llm = SimLLM(LLM, cache_tokens=10 * BLOCK_TOKENS, kv_pool=True)
        first = await _prefill(llm, words("a", 6 * BLOCK_TOKENS))
        decoding = asyncio.ensure_future(_decode(llm, first, 40))  # its 6 of 10 blocks in use
        await asyncio.sleep(0.1)
        waiting = asyncio.ensure_future(_prefill(llm, words("b", 6 * BLOCK_TOKENS)))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # 6 + 6 > 10: it waits
        await decoding
        decoded_at = loop.time()
        await waiting
        stats = llm.stats
        await llm.close()
        return decoded_at, loop.time(), stats.pool_waits

    decoded_at, admitted_at, waits = run_virtual(main())
    assert admitted_at >= decoded_at and waits > 0


def test_a_prefilled_handle_that_is_never_decoded_holds_nothing() -> None:
    async def main() -> tuple[int, int]:
        llm = SimLLM(LLM, cache_tokens=10 * BLOCK_TOKENS, kv_pool=True)
        await _prefill(llm, words("a", 6 * BLOCK_TOKENS))  # abandoned (a cancelled query)
        await _prefill(llm, words("b", 6 * BLOCK_TOKENS))  # fits: nothing is in use
        await llm.close()
        return llm.stats.pool_waits, llm.stats.prefills

    assert run_virtual(main()) == (0, 2)  # admitted at once, never waiting for room


def test_without_pool_mode_running_requests_take_no_room() -> None:
    async def main(kv_pool: bool) -> tuple[int, int]:
        llm = SimLLM(LLM, cache_tokens=10 * BLOCK_TOKENS, kv_pool=kv_pool)
        first = await _prefill(llm, words("a", 6 * BLOCK_TOKENS))
        decoding = llm.stream(Call("q", _decode_node(40), {"kv": first}))
        assert await anext(decoding)  # the decode runs: its first token is out (6 of 10 blocks, in pool mode)
        await _prefill(llm, words("b", 6 * BLOCK_TOKENS))
        decoded_by_then = llm.stats.decode_tokens
        assert len([delta async for delta in decoding]) == 39
        await llm.close()
        return decoded_by_then, llm.stats.pool_waits

    decoded, waits = run_virtual(main(kv_pool=False))
    assert decoded < 40 and waits == 0  # admitted at once, beside the running decode
    decoded, waits = run_virtual(main(kv_pool=True))
    assert decoded == 40 and waits > 0  # the same calls in pool mode: it waited for the decode's room


def test_a_hold_keeps_room_until_it_expires() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        llm = SimLLM(LLM, cache_tokens=10 * BLOCK_TOKENS, kv_pool=True, max_pinned_fraction=1.0)
        prompt = words("a", 6 * BLOCK_TOKENS)
        text = await _decode(llm, await _prefill(llm, prompt), 4)
        assert llm.retain("agent", prompt + text, ttl_s=30.0)
        began = loop.time()
        await _prefill(llm, words("b", 6 * BLOCK_TOKENS))  # needs the held blocks' room
        admitted = loop.time()
        await llm.close()
        return began, admitted

    began, admitted = run_virtual(main())
    assert 30.0 <= admitted - began < 31.0  # admitted once the hold's 30 s were over


def test_a_prompt_larger_than_the_pool_fails_naming_the_pool() -> None:
    async def main() -> None:
        llm = SimLLM(LLM, cache_tokens=4 * BLOCK_TOKENS, kv_pool=True)
        try:
            await _prefill(llm, words("a", 6 * BLOCK_TOKENS))
        finally:
            await llm.close()

    with pytest.raises(RuntimeError, match=r"does not fit the KV pool \(64 tokens\)"):
        run_virtual(main())


def test_a_prompt_larger_than_the_pool_fails_alone_and_the_engine_goes_on() -> None:
    async def main() -> str:
        llm = SimLLM(LLM, cache_tokens=4 * BLOCK_TOKENS, kv_pool=True)
        try:
            with pytest.raises(RuntimeError, match="does not fit the KV pool"):
                await _prefill(llm, words("a", 6 * BLOCK_TOKENS))
            return await _decode(llm, await _prefill(llm, words("b", BLOCK_TOKENS)), 3)
        finally:
            await llm.close()

    assert len(run_virtual(main()).split()) == 3


def test_pool_mode_needs_the_prefix_cache() -> None:
    with pytest.raises(ValueError, match="kv_pool"):
        SimLLM(LLM, prefix_cache=False, kv_pool=True)


def test_priority_decides_who_gets_the_room_first() -> None:
    async def main() -> list[str]:
        llm = SimLLM(LLM, cache_tokens=10 * BLOCK_TOKENS, kv_pool=True)
        first = await _prefill(llm, words("a", 6 * BLOCK_TOKENS))
        decoding = asyncio.ensure_future(_decode(llm, first, 60))
        order: list[str] = []

        async def one(tag: str, priority: float) -> None:
            kv = await _prefill(llm, words(tag, 6 * BLOCK_TOKENS), priority=priority)
            order.append(tag)
            await _decode(llm, kv, 2)

        await asyncio.sleep(0.1)
        late = asyncio.ensure_future(one("late", 1.0))
        await asyncio.sleep(0.1)
        early = asyncio.ensure_future(one("early", 0.0))  # submitted later, but older program
        await asyncio.gather(decoding, late, early)
        await llm.close()
        return order

    assert run_virtual(main()) == ["early", "late"]
