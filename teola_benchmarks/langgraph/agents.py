"""`teola bench --langgraph create_agents`: `create_agent` ReAct agents on a KV-short vLLM-like server.

    result = bench_create_agents(agents=32, seed=0)   # plain agent.ainvoke vs teola.optimize(agent)

Each agent is LangChain's own `create_agent(ChatOpenAI(...), tools)` with no middleware,
replaying one job of the agent bench's traces (`teola_benchmarks.agents.trace`: turns,
tool calls and their durations, result sizes): the simulated vLLM-like server answers
each call with the trace's tool calls (`chat_script`, by the job named in the task and
the turn reached) and its text; the tools wait the trace's durations (times
`tool_time`) and return the trace's results. The server's KV cache is a pool of
`pool_fraction` of the jobs' live contexts (the sum of their mean prompt lengths; at
least the longest context), shared by running requests and the prefix cache as in
vLLM, and it says how big it is in `/metrics`. Teola is told nothing:
`teola.optimize(agent)` reads the cache's size there.

The token sizes are the trace's divided by `shrink` (10 by default: 600 system tokens,
~66 answer tokens a turn), so 32 agents take minutes on a 2-core host; the step costs
are `AGENT_LLM`'s (an 8B model on an H100). Client and server share one process: below
a time scale of 0.5 their CPU work (tokenizing long prompts, LangChain's per-turn work)
stretches simulated time, and the comparison with it. The agents start within
`spread_s` simulated seconds of each other in the trace's order. The systems run the
same jobs on the same server one after the other, the prefix cache emptied before each;
every answer must be equal. Reported per system: mean and p95 job completion time
(simulated seconds) and the prefill tokens the server computed again after evicting
them.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import teola
from teola_adapters.simulated.prefix_cache import BLOCK_TOKENS
from teola_adapters.simulated.servers import SimServers
from teola_adapters.simulated.servers.backend import ScriptedToolCall
from teola_adapters.simulated.text import tokens_of
from teola_benchmarks.agents.agent import system_block, tool_result, words
from teola_benchmarks.agents.bench import AGENT_LLM, POOL_FRACTION
from teola_benchmarks.agents.trace import AgentJob, Shape, ToolCall, make_jobs, mean_context_tokens
from teola_benchmarks.framework_result import AnswerMismatch
from teola_benchmarks.stats import percentile

SYSTEMS = ("langgraph", "teola")
TASK_MARK = "### Task of "
TAG_TOKENS = 8  # per message, beyond its text: the chat template's role tag, the task's and answer's marks


def shrunk_shape(shrink: float) -> Shape:
    """The trace's token sizes divided by `shrink` (turn counts unchanged)."""
    s = Shape()
    return replace(
        s,
        system_tokens=round(s.system_tokens / shrink),
        task_tokens=round(s.task_tokens / shrink),
        answer_tokens=round(s.answer_tokens / shrink),
        result_tokens=round(s.result_tokens / shrink),
    )


@dataclass(frozen=True)
class AgentScript:
    """The jobs' turns, as the server's `chat_script` and as the tools' behaviour."""

    jobs: dict[str, AgentJob]

    def __call__(self, messages: Sequence[dict[str, Any]]) -> list[ScriptedToolCall] | None:
        """The tool calls of the job named in the task, at the turn its messages reached."""
        task = next((m for m in messages if m.get("role") == "user"), None)
        content = str((task or {}).get("content") or "")
        if not content.startswith(TASK_MARK):
            return None
        job = self.jobs[content[len(TASK_MARK) :].split(":", 1)[0]]
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if turn >= len(job.turns):
            return None
        return [
            ScriptedToolCall(call.tool, {"job": job.id, "turn": turn, "call": k})
            for k, call in enumerate(job.turns[turn])
        ]

    def call(self, job: str, turn: int, call: int) -> ToolCall:
        return self.jobs[job].turns[turn][call]


def task_message(job: AgentJob) -> str:
    return f"{TASK_MARK}{job.id}:\n" + words(job.task_seed, job.shape.task_tokens)


def build_agent(
    base_url: str,
    script: AgentScript,
    shape: Shape,
    tool_seconds: float,
    middleware: Sequence[Any] = (),
    *,
    model: str = "sim-8b",
    **model_options: Any,
) -> Any:
    """LangChain's `create_agent` with the trace's two tools; `tool_seconds` real seconds per
    trace second; `model_options` go to `ChatOpenAI` (its HTTP client, `extra_body`)."""
    from langchain.agents import create_agent
    from langchain_core.tools import StructuredTool
    from langchain_openai import ChatOpenAI

    def make_tool(name: str, description: str) -> Any:
        async def run(job: str, turn: int, call: int) -> str:
            traced = script.call(job, turn, call)
            if traced.tool != name:
                raise ValueError(f"{name} called for a {traced.tool} step ({job}, turn {turn}, call {call})")
            await asyncio.sleep(traced.seconds * tool_seconds)  # the tool's traced duration
            return tool_result(traced)

        return StructuredTool.from_function(coroutine=run, name=name, description=description)

    tools = [
        make_tool("read_doc", "Read a shared document."),
        make_tool("run_step", "Run one step of the job."),
    ]
    llm = ChatOpenAI(
        base_url=base_url,
        api_key="x",
        model=model,
        temperature=0,
        max_tokens=shape.answer_tokens,
        max_retries=2,
        **model_options,
    )
    system = system_block(shape) + f"\nAnswer in about {shape.answer_tokens} words."
    return create_agent(llm, tools, system_prompt=system, middleware=list(middleware))


def bench_create_agents(
    *,
    agents: int = 32,
    seed: int = 0,
    time_scale: float = 0.5,
    shrink: float = 10.0,
    tool_time: float = 0.1,
    pool_fraction: float = POOL_FRACTION,
    spread_s: float = 5.0,
    middleware: bool = False,
) -> dict[str, Any]:
    """Plain `agent.ainvoke` then `teola.optimize(agent).ainvoke` (see the module docstring);
    `middleware`: a third system, the agent built with `TeolaMiddleware` and optimized (its
    model and tool calls on Teola's agent runtime)."""
    if agents < 1:
        raise ValueError(f"agents must be at least 1, got {agents}")
    if not pool_fraction > 0:
        raise ValueError(f"pool_fraction must be positive, got {pool_fraction}")
    shape = shrunk_shape(shrink)
    jobs = make_jobs(agents, seed=seed, spread_s=spread_s, shape=shape)
    script = AgentScript({job.id: job for job in jobs})
    live = sum(mean_context_tokens(job) for job in jobs)
    # vLLM needs room for one whole context: a tenth more than the longest, for its answer and whole blocks
    pool_tokens = max(round(pool_fraction * live), round(1.1 * max(context_words(job) for job in jobs)))
    pool_tokens -= pool_tokens % BLOCK_TOKENS  # whole blocks, as the server reports it
    options = {"llm_profile": AGENT_LLM, "kv_cache_tokens": pool_tokens, "chat_script": script}
    with SimServers(time_scale=time_scale, **options) as servers:
        agent = build_agent(servers.base_url, script, shape, tool_time * time_scale)
        fast = teola.optimize(agent)
        systems_run = {"langgraph": agent, "teola": fast}
        if middleware:
            from teola_langchain.agents import TeolaMiddleware

            with_middleware = build_agent(servers.base_url, script, shape, tool_time * time_scale, [TeolaMiddleware()])
            systems_run["teola_middleware"] = teola.optimize(with_middleware)
        try:
            runs = asyncio.run(_measure(systems_run, jobs, servers, time_scale))
        finally:
            for name, system in systems_run.items():
                if name != "langgraph":
                    system.close()
        stats = servers.backend.llm.stats
    systems: dict[str, Any] = {}
    answers: dict[str, list[list[str]]] = {}
    for name, (latencies, outputs, recomputed) in runs.items():
        answers[name] = outputs
        systems[name] = {
            "mean_s": statistics.fmean(latencies),
            "p95_s": percentile(latencies, 95),
            "recomputed_prefill_tokens": recomputed,
        }
    for name, outputs in answers.items():
        if outputs != answers["langgraph"]:
            first = next(i for i, (a, b) in enumerate(zip(answers["langgraph"], outputs, strict=True)) if a != b)
            raise AnswerMismatch(f"create_agent job {jobs[first].id}: {name} answered differently from the agent")
    plain, teola_ = systems["langgraph"], systems["teola"]
    return {
        "agents": agents,
        "seed": seed,
        "time_scale": time_scale,
        "kv_pool_tokens": pool_tokens,
        "model_calls": sum(job.model_calls for job in jobs) * 2,
        "server_llm_steps": stats.steps,
        "systems": systems,
        "speedup_mean": plain["mean_s"] / teola_["mean_s"],
        "speedup_p95": plain["p95_s"] / teola_["p95_s"],
        **(
            {"speedup_mean_middleware": plain["mean_s"] / systems["teola_middleware"]["mean_s"]}
            if "teola_middleware" in systems
            else {}
        ),
        "explain": fast.explain(),
    }


async def _measure(
    systems: dict[str, Any], jobs: Sequence[AgentJob], servers: SimServers, time_scale: float
) -> dict[str, tuple[list[float], list[list[str]], int]]:
    """Each system in turn on an emptied prefix cache: latencies (simulated s), answers, recomputed tokens."""
    import httpx

    results = {}
    async with httpx.AsyncClient() as admin:
        for name, system in systems.items():
            (await admin.post(f"{servers.root_url}/reset_prefix_cache")).raise_for_status()
            before = servers.backend.llm.stats.recomputed_tokens  # read between runs: the server is idle
            latencies, answers = await run_jobs(system, jobs, time_scale)
            results[name] = (latencies, answers, servers.backend.llm.stats.recomputed_tokens - before)
    return results


async def run_jobs(
    system: Any, jobs: Sequence[AgentJob], time_scale: float = 1.0
) -> tuple[list[float], list[list[str]]]:
    """Every job on `system`, each started at its trace offset (times `time_scale` real
    seconds): job completion times (in trace seconds) and answers."""
    began = time.perf_counter()

    async def one(job: AgentJob) -> tuple[float, list[str]]:
        await asyncio.sleep(max(0.0, began + job.start_s * time_scale - time.perf_counter()))
        start = time.perf_counter()
        out = await system.ainvoke({"messages": [("user", task_message(job))]})
        return (time.perf_counter() - start) / time_scale, answer_texts(out)

    done = await asyncio.gather(*(one(job) for job in jobs))
    return [t for t, _ in done], [a for _, a in done]


def context_words(job: AgentJob) -> int:
    """The job's last prompt and answer in the simulated tokenizer's tokens (words; a vLLM
    cache holds at least one whole context): its texts, and a few for each message's tags."""
    s = job.shape
    results = sum(len(tokens_of(tool_result(call))) for turn in job.turns for call in turn)
    messages = 3 + sum(1 + len(turn) for turn in job.turns)  # system, task, answers, tool results
    texts = len(tokens_of(system_block(s))) + s.task_tokens + results + (len(job.turns) + 1) * s.answer_tokens
    return texts + TAG_TOKENS * messages


def answer_texts(out: dict[str, Any]) -> list[str]:
    """An agent run's answers (text and tool calls, each as JSON), for comparing systems."""
    return [_text(m) for m in out["messages"] if getattr(m, "type", "") == "ai"]


def _text(message: Any) -> str:
    calls = [(c["name"], c["args"]) for c in getattr(message, "tool_calls", None) or ()]
    return json.dumps([message.content, calls], sort_keys=True)
