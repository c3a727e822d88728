"""Graph runs call a KV-short server only while their contexts fit its cache (oldest first).

The rule itself is the agent runtime's (`teola_core.agents.admission`, tested there); here:
the context sizes learned from the server's usage reports, the runs' turns at one server,
and `create_agent` agents on the simulated vLLM-like server whose KV pool is shared by
running requests and its prefix cache, optimized with no option: answers equal plain,
and Teola read the cache's size from `/metrics`.
"""

from __future__ import annotations

import asyncio

import pytest

from teola_core.agents.token_rate import CHARS_PER_TOKEN, TokenRate
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
        await sets.call("s", 1_000, run="run1", rank=1, prompt_chars=3_200)  # 800 tokens: fits
        order.append("run1")

        async def second() -> None:
            await sets.call("s", 1_000, run="run2", rank=2, prompt_chars=3_200)  # 800 more: does not
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


def test_create_agent_agents_on_a_kv_short_server_answer_as_plain_and_teola_reads_the_cache_size() -> None:
    pytest.importorskip("langchain_openai")
    pytest.importorskip("uvicorn")
    from teola_benchmarks.langgraph.agents import bench_create_agents

    result = bench_create_agents(agents=6, shrink=100.0, time_scale=0.02, tool_time=0.05)  # AnswerMismatch if not equal
    assert f"KV cache {result['kv_pool_tokens']} tokens" in result["explain"]
    assert set(result["systems"]) == {"langgraph", "teola"}
