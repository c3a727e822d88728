"""SimReplicas: independent instances behind one name, routed by the stated rule."""

from __future__ import annotations

import asyncio

import pytest
from llm_nodes import decode_node, prefill_node

from teola_adapters.simulated import SimLLM, SimReplicas, run_virtual
from teola_adapters.simulated.paper_profiles import LLM
from teola_core.engines.protocol import Call
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.types import KVHandle

PROMPT = " ".join(f"w{i}" for i in range(40))


def two(time_scale: float = 0.0) -> SimReplicas:
    return SimReplicas([SimLLM(LLM, time_scale=time_scale, name=f"llm#{i}") for i in range(2)], name="llm")


def prefill(prompt: str, query: str = "q") -> Call:
    return Call(query, prefill_node(), {"prompt": prompt})


def test_free_calls_go_to_the_least_loaded_instance_ties_round_robin() -> None:
    async def main() -> tuple[list[str], list[int]]:
        llm = two()
        results = await llm.run([prefill(f"{PROMPT} {i}") for i in range(4)])
        return [r["kv"].engine for r in results], llm.served  # type: ignore[index]

    owners, served = asyncio.run(main())
    assert owners == ["llm#0", "llm#1", "llm#0", "llm#1"] and served == [2, 2]


def test_a_busy_instance_is_passed_over() -> None:
    async def main() -> list[str]:
        llm = two(time_scale=1.0)
        kv = (await llm.run_one(prefill(PROMPT)))["kv"]  # llm#0; the cursor moves to llm#1
        kv2 = (await llm.run_one(prefill(PROMPT + " x")))["kv"]  # llm#1; cursor back to llm#0
        long_decode = asyncio.ensure_future(llm.run_one(Call("q", decode_node(50), {"kv": kv})))
        await asyncio.sleep(0.1)  # llm#0 is decoding: one call in flight there, none on llm#1
        third = (await llm.run_one(prefill(PROMPT + " y")))["kv"]
        await long_decode
        return [kv.engine, kv2.engine, third.engine]

    assert run_virtual(main()) == ["llm#0", "llm#1", "llm#1"]


def test_a_kv_handle_brings_its_call_to_the_instance_that_made_it() -> None:
    async def main() -> tuple[str, list[int]]:
        llm = two()
        results = await llm.run([prefill(PROMPT), prefill(PROMPT + " x")])
        kv = results[1]["kv"]  # type: ignore[index]
        await llm.run([Call("q", decode_node(8), {"kv": kv})])  # the cursor points at llm#0 now
        return kv.engine, [e.stats.decodes for e in llm.instances]

    owner, decodes = asyncio.run(main())
    assert owner == "llm#1" and decodes == [0, 1]


def test_instances_keep_their_own_prefix_cache() -> None:
    async def main() -> tuple[int, int]:
        llm = two()
        await llm.run([prefill(PROMPT)])  # llm#0 computes it
        await llm.run([prefill(PROMPT)])  # llm#1 (round robin): its cache is its own, a miss
        missed = llm.stats.cache_hit_tokens
        await llm.run([prefill(PROMPT)])  # llm#0 again: a hit
        return missed, llm.stats.cache_hit_tokens

    missed, hit = asyncio.run(main())
    assert missed == 0 and hit == 32  # two whole 16-token blocks of the 40-token prompt


def test_a_foreign_handle_fails_its_call_alone() -> None:
    async def main() -> list[object]:
        llm = two()
        foreign = KVHandle("elsewhere", PROMPT, None)
        return await llm.run([Call("q", decode_node(4), {"kv": foreign}), prefill(PROMPT)])

    bad, good = asyncio.run(main())
    assert isinstance(bad, ValueError) and "elsewhere" in str(bad)
    assert not isinstance(good, BaseException)


def test_names_must_be_distinct() -> None:
    with pytest.raises(ValueError, match="distinct"):
        SimReplicas([SimLLM(LLM, name="llm"), SimLLM(LLM, name="llm#1")], name="llm")


def full_prefill(prompt: str, prefix_kv: KVHandle) -> Call:
    return Call("q", prefill_node(PrimitiveKind.FULL_PREFILL), {"prompt": prompt, "prefix_kv": prefix_kv})


def partial_prefill(prefix: str) -> Call:
    return Call("q", prefill_node(PrimitiveKind.PARTIAL_PREFILL), {"prefix": prefix})


def test_a_full_prefill_joins_its_partial_when_that_instance_is_among_the_least_loaded() -> None:
    async def main() -> tuple[str, int]:
        llm = two()
        partial = (await llm.run_one(partial_prefill(PROMPT)))["kv"]  # llm#0; the cursor moves to llm#1
        full = (await llm.run_one(full_prefill(PROMPT + " and the rest", partial)))["kv"]
        return full.engine, llm.stats.handle_hit_tokens + llm.stats.cache_hit_tokens

    owner, reused = asyncio.run(main())
    assert owner == "llm#0" and reused == 40  # the partial's 40 tokens, not computed again


def test_a_full_prefill_goes_elsewhere_without_the_partials_kv_when_its_instance_is_busy() -> None:
    async def main() -> tuple[str, str, int]:
        llm = two(time_scale=1.0)
        partial = (await llm.run_one(partial_prefill(PROMPT)))["kv"]  # llm#0
        kv = (await llm.run_one(prefill(PROMPT + " other")))["kv"]  # llm#1
        busy = asyncio.ensure_future(llm.run_one(Call("q", decode_node(50), {"kv": partial})))  # llm#0 decodes
        await asyncio.sleep(0.1)
        full = (await llm.run_one(full_prefill(PROMPT + " and the rest", partial)))["kv"]
        await busy
        second = llm.instances[1].stats
        return kv.engine, full.engine, second.handle_hit_tokens

    other, owner, reused_there = run_virtual(main())
    assert (other, owner) == ("llm#1", "llm#1") and reused_there == 0  # computed there from its own cache
