"""Workflows and agents whose LLM is on a vLLM-like server get program-level order with no
option: calls beyond what the server runs wait in Teola, earliest run first (llama-index-core 0.14).

Real parts: the simulated vLLM-like server (running set and waiting queue of
`max_num_seqs`, vLLM's gauges) and LlamaIndex's `OpenAILike` client pointed at it; the
workflow is the bench's `drafts_workflow` (three drafts at once, then a summary).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from llama_index.core import __version__ as li_version

pytestmark = pytest.mark.skipif(
    tuple(int(p) for p in li_version.split(".")[:2]) < (0, 13), reason="Workflows are tested on the 0.14 line"
)
openai_like = pytest.importorskip("llama_index.llms.openai_like")
pytest.importorskip("uvicorn")

from llama_index.core.agent.workflow import ReActAgent  # noqa: E402
from llama_index.core.llms import MockLLM  # noqa: E402
from llama_index.core.workflow import Workflow  # noqa: E402

import teola  # noqa: E402
from teola_adapters.server_load import ServerCalls, ServerLoadWatch  # noqa: E402
from teola_adapters.simulated.servers import SimServers  # noqa: E402
from teola_benchmarks.llamaindex.workflows import DraftsWorkflow, server_llm  # noqa: E402
from teola_llamaindex.workflows import TeolaWorkflow  # noqa: E402


def client(base_url: str) -> Any:
    return server_llm(base_url, max_tokens=16)


def server_calls(fast: TeolaWorkflow) -> list[ServerCalls]:
    watches = [e.load_watch for e in fast.engines.engines.values() if e.load_watch is not None]
    assert all(isinstance(w, ServerLoadWatch) for w in watches)
    return [calls for w in watches for calls in w.attached]


def burst(servers: SimServers, runs: int = 8) -> tuple[list[str], list[str], list[ServerCalls]]:
    """Plain, then optimized: the runs at once; what Teola learned of the server."""
    workflow = DraftsWorkflow(client(servers.base_url), timeout=60)
    fast = teola.optimize(workflow)
    assert isinstance(fast, TeolaWorkflow)

    async def scenario() -> tuple[list[str], list[str], list[ServerCalls]]:
        plain = await asyncio.gather(*(workflow.run(topic=f"topic {i}") for i in range(runs)))
        optimized = await asyncio.gather(*(fast.run(topic=f"topic {i}") for i in range(runs)))
        calls = server_calls(fast)
        for one in calls:
            await one.settled()
        return plain, optimized, calls

    try:
        return asyncio.run(asyncio.wait_for(scenario(), 120))
    finally:
        fast.close()


def test_calls_beyond_what_the_server_runs_wait_in_teola() -> None:
    with SimServers(time_scale=0.2, max_num_seqs=2) as servers:
        plain, optimized, calls = burst(servers)
    assert optimized == plain
    (one,) = calls
    assert one.vllm and one.limit.capacity == 2 and one.held_total > 0
    assert one.in_flight == 0 and one.held == 0


def test_a_server_without_vllms_gauges_is_never_held() -> None:
    with SimServers(time_scale=0.01, vllm_api=False) as servers:
        plain, optimized, calls = burst(servers)
    assert optimized == plain
    (one,) = calls
    assert one.vllm is False and one.held_total == 0


def test_each_call_arrives_at_its_runs_start() -> None:
    """Where calls wait (an engine at its concurrency, a full server), the engine
    schedulers serve them by arrival: a run's calls arrive when the run began, so an
    earlier run's later call goes before a later run's first one."""
    workflow = DraftsWorkflow(MockLLM(max_tokens=4))
    fast = teola.optimize(workflow)
    assert isinstance(fast, TeolaWorkflow)
    arrivals: list[tuple[str, float | None]] = []

    async def two_runs() -> list[str]:
        runtime = fast.runtime()
        run = runtime.run

        async def recording(graph: Any, inputs: Any, **kwargs: Any) -> Any:
            arrivals.append((kwargs["query_id"].split("/")[0], kwargs["arrival"]))
            return await run(graph, inputs, **kwargs)

        runtime.run = recording
        return list(await asyncio.gather(fast.run(topic="a"), fast.run(topic="b")))

    assert asyncio.run(two_runs()) == asyncio.run(_plain_two_runs(workflow))
    by_run: dict[str, set[float | None]] = {}
    for run_key, arrival in arrivals:
        by_run.setdefault(run_key, set()).add(arrival)
    assert len(arrivals) == 8 and sorted(by_run) == ["run0", "run1"]  # four calls a run
    (first,), (second,) = by_run["run0"], by_run["run1"]  # each run's calls: one arrival, its start
    assert first is not None and second is not None and first < second


async def _plain_two_runs(workflow: Workflow) -> list[str]:
    return list(await asyncio.gather(workflow.run(topic="a"), workflow.run(topic="b")))


def test_an_agent_on_a_vllm_like_server_has_its_load_watched() -> None:
    on_server = teola.optimize(ReActAgent(tools=[], llm=client("http://127.0.0.1:8000/v1")))
    elsewhere = teola.optimize(ReActAgent(tools=[], llm=MockLLM()))
    assert isinstance(on_server.engines.engines[on_server.engine].load_watch, ServerLoadWatch)
    assert elsewhere.engines.engines[elsewhere.engine].load_watch is None


def test_an_agent_on_a_server_that_reports_its_kv_cache_is_admitted_by_it() -> None:
    """A `FunctionAgent` whose `OpenAILike` LLM calls a vLLM-like server with a KV cache of
    4,096 tokens: once the server is read, the agent's model engine is a `KVPool` of that
    size (the agent runtime admits programs against it), and answers stay the plain agent's."""
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.tools import FunctionTool

    from teola_adapters.simulated.servers.backend import ScriptedToolCall

    def script(messages: Any) -> list[ScriptedToolCall] | None:
        asked = [m for m in messages if m.get("role") == "tool"]
        return None if asked else [ScriptedToolCall("lookup", {"key": str(messages[-1].get("content"))[:12]})]

    def lookup(key: str) -> str:
        """Look a key up."""
        return f"value of {key}"

    with SimServers(time_scale=0.05, kv_cache_tokens=4_096, chat_script=script) as servers:
        llm = openai_like.OpenAILike(
            model="sim",
            api_base=servers.base_url,
            api_key="x",
            is_chat_model=True,
            is_function_calling_model=True,
            max_tokens=16,
        )
        agent = FunctionAgent(tools=[FunctionTool.from_defaults(lookup)], llm=llm)
        fast = teola.optimize(agent)
        engine = fast.engines.engines[fast.engine]

        async def answers(app: Any) -> list[str]:
            outs = await asyncio.gather(*(app.run(user_msg=f"topic {i}") for i in range(4)))
            return [str(out.response.content) for out in outs]

        async def scenario() -> tuple[list[str], list[str], Any]:
            plain = await answers(agent)
            optimized = await answers(fast)  # the server is read
            for calls in engine.load_watch.attached:
                await calls.settled()
            optimized = await answers(fast)
            return plain, optimized, fast.runtime().admission(fast.engine)

        try:
            plain, optimized, admission = asyncio.run(asyncio.wait_for(scenario(), 120))
        finally:
            fast.close()
    assert optimized == plain
    assert engine.kv_capacity_tokens() == 4_096 and admission is not None and admission.limit_tokens == 4_096
