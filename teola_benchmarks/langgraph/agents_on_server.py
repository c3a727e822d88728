"""`create_agent` ReAct agents on a model server of your own (a real vLLM): plain vs `teola.optimize`.

    python -m teola_benchmarks.langgraph.agents_on_server http://127.0.0.1:8012 --model smollm2

The jobs are the agent bench's traces (`teola_benchmarks.agents.trace`) at a small model's
size (`SMALL_SHAPE`): each agent is LangChain's own `create_agent(ChatOpenAI(...), tools)`
with no middleware. The served model reads every prompt and writes every answer (greedy,
the trace's answer length: `ignore_eos`); a model of this size does not call tools on
cue, so the client's HTTP transport (`ScriptedToolCalls`) puts each turn's traced tool calls
into the model's answer, as the simulated server's `chat_script` does. The tools wait
their traced durations (times `tool_time`, real seconds) and return the traced results.

Serve the model with a KV cache smaller than the agents' live contexts (vLLM's
`--num-gpu-blocks-override`; `pool_blocks()` says how many blocks make `pool_fraction`
of them) and with `--enable-auto-tool-choice --tool-call-parser hermes` (the requests
carry the tools, as `create_agent` sends them). Teola is told nothing: it reads the
cache's size from `/metrics`. The systems run the same jobs one after the other, the
prefix cache emptied before each (`/reset_prefix_cache`); every answer must be equal
(`AnswerMismatch` otherwise). Reported per system: mean and p95 job completion time (real
seconds), and the prompt tokens the server computed (`vllm:prompt_tokens_total` less
`vllm:prefix_cache_hits_total`, as its own counters give them) and its preemptions. Prints
one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

import teola
from teola_adapters.server_load import parse_reading
from teola_adapters.simulated.servers.completions import tool_call_items
from teola_benchmarks.agents.agent import words
from teola_benchmarks.agents.trace import Shape, make_jobs, mean_context_tokens
from teola_benchmarks.framework_result import AnswerMismatch
from teola_benchmarks.langgraph.agents import AgentScript, build_agent, context_words, run_jobs
from teola_benchmarks.stats import percentile

SYSTEMS = ("langgraph", "teola")
# The trace's shape at a 135M model's size on a CPU: prompts of a few thousand tokens
# (SmolLM2's tokenizer makes about 3 tokens of each pseudo-word), at most 12 turns.
SMALL_SHAPE = Shape(system_tokens=100, task_tokens=60, answer_tokens=16, result_tokens=50, mean_turns=6.0, max_turns=12)
COUNTERS = ("vllm:prompt_tokens_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total")


@dataclass
class ScriptedToolCalls(httpx.AsyncBaseTransport):
    """The client's transport: chat answers carry the turn's traced tool calls (`script`).

    The request goes to the server unchanged; in its (non-streamed) answer the model's text
    stays and the calls are added, `finish_reason` "tool_calls", as a tool-calling model's
    answer would read. Answers of turns past the trace's last are the model's own.
    """

    script: AgentScript
    inner: httpx.AsyncBaseTransport = field(default_factory=httpx.AsyncHTTPTransport)
    ids: itertools.count = field(default_factory=itertools.count)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.method != "POST" or not request.url.path.endswith("/chat/completions"):
            return response
        body = json.loads(request.content)
        calls = self.script(body["messages"]) if body.get("tools") else None
        if not calls or body.get("stream"):
            return response
        await response.aread()
        if response.status_code != 200:
            return response
        answer = response.json()
        choice = answer["choices"][0]
        choice["message"]["tool_calls"] = tool_call_items(calls, f"{answer['id']}-{next(self.ids)}")
        choice["finish_reason"] = "tool_calls"
        headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-encoding")}
        return httpx.Response(200, headers=headers, json=answer, request=request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def pool_blocks(
    agents: int, *, seed: int = 0, tokens_per_word: float, block_size: int, pool_fraction: float = 1 / 3
) -> int:
    """The KV blocks that hold `pool_fraction` of the jobs' live contexts (at least the
    longest context and a tenth more), for vLLM's `--num-gpu-blocks-override`."""
    jobs = make_jobs(agents, seed=seed, shape=SMALL_SHAPE)
    live = tokens_per_word * sum(mean_context_tokens(job) for job in jobs)
    longest = tokens_per_word * max(context_words(job) for job in jobs)
    return -(-round(max(pool_fraction * live, 1.1 * longest)) // block_size)


async def bench_agents_on_server(
    base_url: str,
    model: str,
    *,
    agents: int = 16,
    seed: int = 0,
    tool_time: float = 0.2,
    spread_s: float = 5.0,
    middleware: bool = False,
) -> dict[str, Any]:
    """Plain `agent.ainvoke` then `teola.optimize(agent).ainvoke` on the server at `base_url`
    (its root, without `/v1`); see the module docstring. `middleware`: a third system, the
    agent built with `TeolaMiddleware` and optimized (its calls on Teola's agent runtime,
    with vLLM's `priority` where the server takes it)."""
    if agents < 1:
        raise ValueError(f"agents must be at least 1, got {agents}")
    jobs = make_jobs(agents, seed=seed, spread_s=spread_s, shape=SMALL_SHAPE)
    script = AgentScript({job.id: job for job in jobs})

    def agent(*middleware: Any) -> Any:  # a client per system: each system's connections are its own
        client = httpx.AsyncClient(transport=ScriptedToolCalls(script), timeout=600)
        return build_agent(
            f"{base_url}/v1",
            script,
            SMALL_SHAPE,
            tool_time,
            middleware,
            model=model,
            http_async_client=client,
            extra_body={"ignore_eos": True},
        )

    systems: dict[str, Any] = {"langgraph": agent(), "teola": teola.optimize(agent())}
    if middleware:
        from teola_langchain.agents import TeolaMiddleware

        systems["teola_middleware"] = teola.optimize(agent(TeolaMiddleware()))
    fast = systems["teola"]
    results: dict[str, Any] = {}
    answers: dict[str, list[list[str]]] = {}
    try:
        async with httpx.AsyncClient(timeout=60) as admin:
            per_word = await _tokens_per_word(admin, base_url, model)
            for name, system in systems.items():
                await _empty_prefix_cache(admin, base_url)
                before = _counters(await _metrics(admin, base_url))
                latencies, answers[name] = await run_jobs(system, jobs)
                page = await _metrics(admin, base_url)
                after = _counters(page)
                delta = {k: after[k] - before[k] for k in COUNTERS}
                results[name] = {
                    "mean_s": statistics.fmean(latencies),
                    "p95_s": percentile(latencies, 95),
                    "prompt_tokens": delta["vllm:prompt_tokens_total"],
                    "prompt_tokens_computed": delta["vllm:prompt_tokens_total"] - delta["vllm:prefix_cache_hits_total"],
                    "preemptions": delta["vllm:num_preemptions_total"],
                }
            reading = parse_reading(page)  # Teola's own reading of the server's KV cache size
            kv_tokens = None if reading is None else reading.kv_tokens
    finally:
        for name, system in systems.items():
            if name != "langgraph":
                system.close()
    live = per_word * sum(mean_context_tokens(job) for job in jobs)  # the jobs' mean contexts, in tokens
    for name, outputs in answers.items():
        if outputs != answers["langgraph"]:
            first = next(i for i, (a, b) in enumerate(zip(answers["langgraph"], outputs, strict=True)) if a != b)
            raise AnswerMismatch(f"create_agent job {jobs[first].id}: {name} answered differently from the agent")
    return {
        "server": base_url,
        "model": model,
        "agents": agents,
        "seed": seed,
        "tool_time": tool_time,
        "model_calls": sum(job.model_calls for job in jobs),  # per system, by the trace
        "model_calls_made": {name: sum(len(a) for a in outputs) for name, outputs in answers.items()},
        "server_kv_tokens": kv_tokens,
        "live_context_tokens": round(live),
        "kv_share_of_live": None if kv_tokens is None else kv_tokens / live,
        "systems": results,
        "speedup_mean": results["langgraph"]["mean_s"] / results["teola"]["mean_s"],
        "speedup_p95": results["langgraph"]["p95_s"] / results["teola"]["p95_s"],
        **(
            {
                "speedup_mean_middleware": results["langgraph"]["mean_s"] / results["teola_middleware"]["mean_s"],
                "speedup_p95_middleware": results["langgraph"]["p95_s"] / results["teola_middleware"]["p95_s"],
                "explain_middleware": systems["teola_middleware"].explain(),
            }
            if middleware
            else {}
        ),
        "explain": fast.explain(),
    }


async def _tokens_per_word(admin: httpx.AsyncClient, base_url: str, model: str) -> float:
    """The served model's tokens per pseudo-word of the jobs' texts (vLLM's `/tokenize`)."""
    sample = words("sizing", 1000)
    response = await admin.post(f"{base_url}/tokenize", json={"model": model, "prompt": sample})
    response.raise_for_status()
    return int(response.json()["count"]) / 1000


async def _empty_prefix_cache(admin: httpx.AsyncClient, base_url: str) -> None:
    """`/reset_prefix_cache`: each system starts on an empty cache (vLLM serves it in dev mode only)."""
    response = await admin.post(f"{base_url}/reset_prefix_cache")
    if response.status_code == 404:
        raise RuntimeError(
            f"{base_url} has no /reset_prefix_cache: start vLLM with VLLM_SERVER_DEV_MODE=1, so that "
            "each system starts on an empty prefix cache"
        )
    response.raise_for_status()


async def _metrics(admin: httpx.AsyncClient, base_url: str) -> str:
    """The server's `/metrics` page."""
    response = await admin.get(f"{base_url}/metrics")
    response.raise_for_status()
    return response.text


def _counters(page: str) -> dict[str, float]:
    """The `COUNTERS` of a `/metrics` page, each summed over its labels (0 where absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    found = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name in found:
                found[sample.name] += sample.value
    return found


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base_url", help="the server's root URL (without /v1)")
    p.add_argument("--model", required=True, help="the served model's name")
    p.add_argument("--agents", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tool-time", type=float, default=0.2, help="real seconds per traced tool second")
    p.add_argument("--middleware", action="store_true", help="a third system: the agent built with TeolaMiddleware")
    args = p.parse_args(argv)
    if args.agents < 1 or args.tool_time < 0:
        p.error("--agents must be >= 1 and --tool-time >= 0")
    result = asyncio.run(
        bench_agents_on_server(
            args.base_url.rstrip("/"),
            args.model,
            agents=args.agents,
            seed=args.seed,
            tool_time=args.tool_time,
            middleware=args.middleware,
        )
    )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
