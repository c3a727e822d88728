"""Zero configuration: `teola.optimize(graph)` learns a vLLM-like server's bound from its `/metrics`.

Real parts: the simulated vLLM-like server (running set, waiting queue, vLLM's gauges) and
`ChatOpenAI` pointed at it. A burst of fan-out runs is larger than Teola's starting limit
(32), so calls are held and the server is read: where requests wait there, its bound is
what runs; where none wait, the limit grows; a server without vLLM's gauges is never held.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("langchain_openai")
pytest.importorskip("uvicorn")

from fan_out_graph import fan_out

import teola
from teola_adapters.server_load import ServerCalls
from teola_adapters.simulated.servers import SimServers
from teola_core.scheduler.server_limit import START_LIMIT
from teola_examples.common import openai_models


def burst(servers: SimServers, runs: int = 3, items: int = 12) -> tuple[list[Any], list[Any], ServerCalls, str]:
    """Plain runs, then (after one run that lets Teola read the server) the same runs optimized."""
    llm, _ = openai_models(servers.base_url, max_tokens=16)
    graph = fan_out(llm)
    fast = teola.optimize(graph)
    inputs = [{"items": [f"run {r} item {i}" for i in range(items)], "answers": []} for r in range(runs)]

    async def scenario() -> tuple[list[Any], list[Any], ServerCalls, str]:
        plain = await asyncio.gather(*(graph.ainvoke(x) for x in inputs))
        await fast.ainvoke({"items": ["warm up"], "answers": []})
        admission = fast._teola.admission(asyncio.get_running_loop())
        (calls,) = admission.servers()
        await calls.settled()  # the first call's reading is in
        optimized = await asyncio.gather(*(fast.ainvoke(x) for x in inputs))
        await calls.settled()
        return plain, optimized, calls, fast.explain()

    try:
        return asyncio.run(asyncio.wait_for(scenario(), 120))
    finally:
        fast.close()


def test_a_saturated_server_is_read_and_calls_beyond_what_it_runs_wait_in_teola() -> None:
    with SimServers(time_scale=0.2, max_num_seqs=2) as servers:
        plain, optimized, calls, explained = burst(servers)
    assert optimized == plain
    assert calls.vllm and calls.limit.capacity == 2 and calls.limit.limit in (3, 4)  # 1 queued there, or +1
    assert calls.held_total > 0 and calls.in_flight == 0 and calls.held == 0
    assert f"{servers.root_url}: vLLM-like; runs 2 at once" in explained


def test_a_server_with_room_lets_the_limit_grow_and_runs_every_call_at_once() -> None:
    with SimServers(time_scale=0.5) as servers:
        plain, optimized, calls, _ = burst(servers)
    assert optimized == plain
    assert calls.vllm and calls.limit.capacity is None and calls.limit.limit == 2 * START_LIMIT
    assert calls.in_flight == 0 and calls.held == 0


def test_a_server_without_vllms_gauges_is_never_held() -> None:
    with SimServers(time_scale=0.01, vllm_api=False) as servers:
        plain, optimized, calls, explained = burst(servers)
    assert optimized == plain
    assert calls.vllm is False and calls.held_total == 0 and calls.error is None
    assert "no vLLM load gauges in /metrics: calls go at once" in explained
