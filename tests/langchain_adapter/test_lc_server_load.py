"""An optimized chain's model engine learns its server's bound from `/metrics` (zero configuration).

Real parts: the simulated vLLM-like server (running set and waiting queue of
`max_num_seqs`, vLLM's gauges) and `ChatOpenAI` pointed at it. Calls beyond what the
server runs then wait in Teola's engine scheduler (earliest query first) instead of in the
server's queue; the answers are the chain's own.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("langchain_openai")
pytest.importorskip("uvicorn")

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.runnables import RunnableParallel

import teola
from teola_adapters.server_load import ServerLoadWatch
from teola_adapters.simulated.servers import SimServers
from teola_examples.common import openai_models


def three_asks(llm: Any) -> Any:
    """Three model calls of one query at once, then one that reads their answers."""
    ask = {k: PromptTemplate.from_template(f"{k} about {{topic}}") | llm | StrOutputParser() for k in "abc"}
    joined = PromptTemplate.from_template("Sum up: {a} / {b} / {c}")
    return RunnableParallel(ask) | joined | llm | StrOutputParser()


def run_burst(servers: SimServers, queries: int = 8, **options: Any) -> tuple[list[str], list[str], Any]:
    """Plain, then optimized: the queries at once; what Teola learned of the server, and the object."""
    llm, _ = openai_models(servers.base_url, max_tokens=16)
    chain = three_asks(llm)
    fast = teola.optimize(chain, **options)
    inputs = [{"topic": f"topic {i}"} for i in range(queries)]

    async def scenario() -> tuple[list[str], list[str], Any]:
        plain = await asyncio.gather(*(chain.ainvoke(x) for x in inputs))
        optimized = await asyncio.gather(*(fast.ainvoke(x) for x in inputs))
        watches = [e.load_watch for e in fast._engines.engines.engines.values() if e.load_watch is not None]
        assert all(isinstance(w, ServerLoadWatch) for w in watches)
        on_graph = [calls for w in watches for calls in w.attached]
        as_written = fast.programs.admission(asyncio.get_running_loop()).servers()
        for calls in (*on_graph, *as_written):
            await calls.settled()
        return plain, optimized, (on_graph, as_written, fast)

    try:
        return asyncio.run(asyncio.wait_for(scenario(), 120))
    finally:
        fast.close()


def test_on_teolas_graph_calls_beyond_what_the_server_runs_wait_in_its_engine_scheduler() -> None:
    with SimServers(time_scale=0.2, max_num_seqs=2) as servers:
        plain, optimized, (on_graph, as_written, fast) = run_burst(servers, execution="graph")
    assert optimized == plain and fast.calls_on_graph == 8 and as_written == []
    (calls,) = on_graph
    assert calls.vllm and calls.limit.capacity == 2 and calls.held_total > 0
    assert calls.in_flight == 0 and calls.held == 0
    assert "(on Teola's graph): http://127.0.0.1" in fast.explain()


def test_run_as_langchain_runs_it_each_call_is_a_program_whose_model_calls_teola_admits() -> None:
    with SimServers(time_scale=0.2, max_num_seqs=2) as servers:
        plain, optimized, (on_graph, as_written, fast) = run_burst(servers)
    assert optimized == plain and fast.calls_on_graph == 0 and on_graph == []
    (calls,) = as_written
    assert calls.vllm and calls.limit.capacity == 2 and calls.held_total > 0
    assert fast.programs.runs == 8 and fast.programs.model_calls == 8 * 4
    assert "calls run as LangChain runs them: http://127.0.0.1" in fast.explain()


@pytest.mark.parametrize("execution", ["graph", "auto"])
def test_a_server_without_vllms_gauges_is_read_once_and_never_held(execution: str) -> None:
    with SimServers(time_scale=0.01, vllm_api=False) as servers:
        plain, optimized, (on_graph, as_written, _) = run_burst(servers, execution=execution)
    assert optimized == plain
    (calls,) = on_graph or as_written
    assert calls.vllm is False and calls.held_total == 0 and calls.limit.readings == 0


def test_an_agent_with_the_middleware_learns_its_models_server_at_the_first_call() -> None:
    """`create_agent` with `TeolaMiddleware`: the compiled agent holds its model out of reach,
    so the server is found at the first model call; from then on calls beyond what the
    server runs wait in Teola, in program order."""
    from langchain.agents import create_agent

    from teola_langchain.agents import OptimizedAgent, TeolaMiddleware

    with SimServers(time_scale=0.2, max_num_seqs=2) as servers:
        llm, _ = openai_models(servers.base_url, max_tokens=16)
        agent = create_agent(llm, [], middleware=[TeolaMiddleware()])
        fast = teola.optimize(agent)
        assert isinstance(fast, OptimizedAgent)

        async def contents(app: Any) -> list[list[str]]:
            runs = [app.ainvoke({"messages": [("user", f"topic {i}")]}) for i in range(12)]
            return [[str(m.content) for m in out["messages"]] for out in await asyncio.gather(*runs)]

        async def scenario() -> tuple[list[list[str]], list[list[str]], Any]:
            plain = await contents(agent)
            optimized = await contents(fast)  # the server is found, then learned
            optimized = await contents(fast)  # a burst on a learned server: calls wait in Teola
            (calls,) = fast.engines.engines[fast.engine_name].load_watch.attached
            await calls.settled()
            return plain, optimized, calls

        try:
            plain, optimized, calls = asyncio.run(asyncio.wait_for(scenario(), 120))
        finally:
            fast.close()
    assert optimized == plain
    assert calls.vllm and calls.limit.capacity == 2 and calls.held_total > 0
    fixed = teola.optimize(create_agent(llm, [], middleware=[TeolaMiddleware()]), model_concurrency=4)
    assert fixed.engines.engines[fixed.engine_name].load_watch is None  # a bound given is kept


def test_an_agent_with_the_middleware_is_admitted_by_the_kv_cache_its_server_reports() -> None:
    """On a server that says how big its KV cache is, the agent's model engine is a `KVPool`
    of that size, with prompts counted at the server's own tokens per character: the agent
    runtime admits programs by KV working set there, and answers stay the plain agent's."""
    from langchain.agents import create_agent

    from teola_langchain.agents import TeolaMiddleware

    with SimServers(time_scale=0.05, kv_cache_tokens=4_096) as servers:
        llm, _ = openai_models(servers.base_url, max_tokens=16)
        agent = create_agent(llm, [], middleware=[TeolaMiddleware()])
        fast = teola.optimize(agent)
        engine = fast.engines.engines[fast.engine_name]

        async def contents(app: Any) -> list[list[str]]:
            runs = [app.ainvoke({"messages": [("user", f"topic {i} " + "word " * 40)]}) for i in range(6)]
            return [[str(m.content) for m in out["messages"]] for out in await asyncio.gather(*runs)]

        async def scenario() -> tuple[list[list[str]], list[list[str]], Any]:
            plain = await contents(agent)
            optimized = await contents(fast)  # the server is found and read
            (calls,) = engine.load_watch.attached
            await calls.settled()
            optimized = await contents(fast)  # now admitted by the server's KV cache
            assert "(KV pool 4096 tokens: programs admitted by KV working set)" in fast.explain()
            return plain, optimized, fast.runtime().admission(fast.engine_name)

        try:
            plain, optimized, admission = asyncio.run(asyncio.wait_for(scenario(), 120))
        finally:
            fast.close()
    assert optimized == plain
    assert engine.kv_capacity_tokens() == 4_096 and admission is not None and admission.limit_tokens == 4_096
    assert engine.rate.prompt_tokens > 0  # learned from the server's usage reports
    text = f"topic 0 {'word ' * 40}"  # 42 of the simulated tokenizer's tokens (words), 4 by OpenAI's rule of thumb
    assert 42 <= engine.rate.prompt_tokens_of(len(text)) <= 60


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_an_agent_with_the_middleware_sends_priority_where_the_server_takes_it(policy: str) -> None:
    """Teola asks the server once whether it takes vLLM's `priority` (a one-token completion
    with `priority: 1`); where it does, later model calls carry their program's rank in
    `extra_body`, and where it refuses (the simulated server under FCFS, as vLLM before
    0.32) none does. Answers stay the plain agent's either way."""
    from langchain.agents import create_agent

    from teola_langchain.agents import TeolaMiddleware

    with SimServers(time_scale=0.05, max_num_seqs=2, scheduling_policy=policy) as servers:
        llm, _ = openai_models(servers.base_url, max_tokens=16)
        agent = create_agent(llm, [], middleware=[TeolaMiddleware()])
        fast = teola.optimize(agent)
        engine = fast.engines.engines[fast.engine_name]

        async def contents(app: Any) -> list[list[str]]:
            runs = [app.ainvoke({"messages": [("user", f"topic {i}")]}) for i in range(6)]
            return [[str(m.content) for m in out["messages"]] for out in await asyncio.gather(*runs)]

        async def scenario() -> tuple[list[list[str]], list[list[str]], int]:
            plain = await contents(agent)
            optimized = await contents(fast)  # the server is found and asked
            await engine.priority.settled()
            asked = servers.backend.requests["with_priority"]  # the question itself, and calls after its answer
            optimized = await contents(fast)
            return plain, optimized, servers.backend.requests["with_priority"] - asked

        try:
            plain, optimized, sent = asyncio.run(asyncio.wait_for(scenario(), 120))
            explained = fast.explain()
        finally:
            fast.close()
    assert optimized == plain
    if policy == "priority":
        assert engine.priority.accepted and sent == 6
        assert "takes `priority`: calls carry their program's rank" in explained
    else:
        assert not engine.priority.accepted and sent == 0
        assert "refused `priority`: calls go without" in explained


def test_a_prioritized_request_keeps_the_models_own_extra_body() -> None:
    """The priority goes into the call's model settings beside what the model's `extra_body`
    (or the request's own `extra_body` setting, which replaces the model's) already sends."""
    from langchain.agents.middleware import ModelRequest
    from langchain_openai import ChatOpenAI

    from teola_langchain.agents.engine import prioritized

    model = ChatOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x", model="m", extra_body={"ignore_eos": True})
    request = ModelRequest(model=model, messages=[], model_settings={"temperature": 0})
    sent = prioritized(request, 7)
    assert sent.model_settings == {"temperature": 0, "extra_body": {"ignore_eos": True, "priority": 7}}
    assert request.model_settings == {"temperature": 0} and model.extra_body == {"ignore_eos": True}  # untouched
    own = ModelRequest(model=model, messages=[], model_settings={"extra_body": {"top_k": 3}})
    assert prioritized(own, 2).model_settings == {"extra_body": {"top_k": 3, "priority": 2}}
