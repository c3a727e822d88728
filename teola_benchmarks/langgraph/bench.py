"""`teola bench --langgraph EXAMPLE`: an example graph, LangGraph's `ainvoke` vs `teola.optimize`.

One set of simulated servers (`teola_adapters.simulated.servers.SimServers`), one
compiled graph, the same inputs for both systems, run one after the other, each as a
closed loop of `concurrency` workers, or with `rate` an open loop of Poisson arrivals
(`rate` runs per simulated second, the sequence set by `seed`, the same for both)
(`langgraph`: `graph.ainvoke`; `teola`: `teola.optimize(graph, **options).ainvoke`).
Before each system a warm-up run (untimed), then the same run alone on an emptied prefix
cache (`alone_s`); the cache is emptied again before the measured runs. Both systems'
answers (`module.answer(output)`) must be equal (else `AnswerMismatch`).

`max_num_seqs` gives the LLM server vLLM's bound on running requests (the others queue,
first come first served; `scheduling_policy="priority"` orders them by request priority).
Teola is not told it: `teola.optimize(graph)` learns it from the server's `/metrics`
(zero configuration; `options` may still give `model_concurrency`). Without it the server
runs every request at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import teola
from teola_adapters.simulated.servers import Batching, SimServers
from teola_benchmarks.app_names import LANGGRAPH_EXAMPLES as EXAMPLES
from teola_benchmarks.app_names import import_example
from teola_benchmarks.framework_result import FrameworkBenchResult, check_equal
from teola_benchmarks.framework_runs import check_sizes, closed_loop, measure_systems
from teola_benchmarks.harness import arrival_times, open_loop

SYSTEMS = ("langgraph", "teola")


def bench_langgraph(
    example: str,
    *,
    queries: int = 16,
    concurrency: int = 4,
    time_scale: float = 0.5,
    batching: Batching = "dynamic",
    max_num_seqs: int | None = None,
    rate: float | None = None,
    seed: int = 0,
    options: dict[str, Any] | None = None,
) -> FrameworkBenchResult:
    """Run both systems on one example against one set of servers (see the module docstring)."""
    check_sizes(queries, concurrency)
    if rate is not None and not rate > 0:
        raise ValueError(f"rate must be > 0 runs per second, got {rate}")
    module = import_example(example, EXAMPLES, "langgraph_")
    from teola_examples.common import corpus, openai_models

    inputs = module.inputs(queries + 1)
    options = {**module.OPTIMIZE_OPTIONS, **(options or {})}
    with SimServers(time_scale=time_scale, batching=batching, max_num_seqs=max_num_seqs) as servers:
        llm, embeddings = openai_models(servers.base_url)
        graph = module.build_graph(llm, embeddings, corpus=corpus())
        fast = teola.optimize(graph, **options)
        try:
            arrivals = None if rate is None else [t * time_scale for t in arrival_times(rate, queries, seed)]
            latencies, outputs, alone = asyncio.run(
                _measure(graph, fast, inputs[0], inputs[1:], concurrency, arrivals, servers)
            )
        finally:
            fast.close()
    answers = {name: [module.answer(o) for o in outs] for name, outs in outputs.items()}
    check_equal(example, inputs[1:], answers, "langgraph")
    b = servers.backend
    server = {
        "requests": dict(b.requests),
        "llm_steps": b.llm.stats.steps,
        "alone_s": alone,
        "max_num_seqs": max_num_seqs,
        "arrivals": "closed loop" if rate is None else {"poisson_rate": rate, "seed": seed},
        "teola_options": {k: v for k, v in options.items() if isinstance(v, int | float | str | bool)},
    }
    return FrameworkBenchResult(example, queries, concurrency, time_scale, batching, latencies, server)


async def _measure(
    graph: Any,
    fast: Any,
    warmup: Any,
    inputs: Sequence[Any],
    concurrency: int,
    arrivals: Sequence[float] | None,
    servers: SimServers,
) -> tuple[dict[str, list[float]], dict[str, list[Any]], dict[str, float]]:
    def run(ask: Any) -> Any:
        return closed_loop(ask, inputs, concurrency) if arrivals is None else open_loop(ask, inputs, arrivals)

    return await measure_systems(
        {
            name: (system.ainvoke, lambda s=system: run(s.ainvoke))
            for name, system in (("langgraph", graph), ("teola", fast))
        },
        warmup,
        servers.root_url,
    )
