"""`teola bench --llamaindex EXAMPLE`: an example LlamaIndex app, its own execution vs Teola.

    result = bench_llamaindex("fusion_query_engine", queries=16, concurrency=4)
    result.speedups()["llamaindex"], result.server["alone_s"]

QueryPipelines (`examples`, llama-index-core <= 0.12) or query engines (`query_engines`,
both lines) on one set of simulated servers, each system a closed loop of `concurrency`
workers; answers (as text) must equal LlamaIndex's (`AnswerMismatch`). How each system
is driven: `docs/benchmarks.md`. Needs fastapi, uvicorn and openai.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import teola
from teola_adapters.simulated.servers import Batching, SimServers
from teola_benchmarks.app_names import LLAMAINDEX_EXAMPLES
from teola_benchmarks.framework_result import FrameworkBenchResult, check_equal, server_figures
from teola_benchmarks.framework_runs import check_sizes, closed_loop, measure_systems
from teola_benchmarks.llamaindex.data import build_index, questions
from teola_benchmarks.llamaindex.models import ServerEmbedding, ServerLLM
from teola_benchmarks.llamaindex.query_engines import QUERY_ENGINES

SYSTEMS = ("llamaindex", "teola")

Ask = Callable[[Any, str], Awaitable[Any]]
"""One question to an app, through the app's own async API."""


def bench_llamaindex(
    example: str,
    *,
    queries: int = 16,
    concurrency: int = 4,
    time_scale: float = 0.5,
    batching: Batching = "dynamic",
) -> FrameworkBenchResult:
    """Run both systems on one example against one set of servers (see the module docstring)."""
    if example not in LLAMAINDEX_EXAMPLES:
        raise ValueError(f"unknown example {example!r} (known: {', '.join(LLAMAINDEX_EXAMPLES)})")
    check_sizes(queries, concurrency)
    inputs = questions(queries + 1)
    warmup, measured = inputs[0], inputs[1:]
    with SimServers(time_scale=time_scale, batching=batching) as servers:
        llm = ServerLLM(base_url=servers.base_url)
        index = build_index(ServerEmbedding(base_url=servers.base_url))
        app, ask = _build(example, llm, index)
        fast = teola.optimize(app)
        try:
            latencies, answers, alone = asyncio.run(
                _measure({"llamaindex": app, "teola": fast}, ask, warmup, measured, concurrency, servers.root_url)
            )
        finally:
            fast.close()
    check_equal(example, measured, answers, "llamaindex")
    server = server_figures(servers.backend, alone)
    return FrameworkBenchResult(example, queries, concurrency, time_scale, batching, latencies, server)


def _build(example: str, llm: ServerLLM, index: Any) -> tuple[Any, Ask]:
    """The example's app and how to ask it: a query engine, or a QueryPipeline (imported only then: <= 0.12)."""
    if example in QUERY_ENGINES:
        return QUERY_ENGINES[example](llm, index), _ask_engine
    try:
        from teola_benchmarks.llamaindex.examples import EXAMPLES
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"example {example!r} is a QueryPipeline, which needs llama-index-core <= 0.12 ({exc})"
        ) from exc
    return EXAMPLES[example](llm, index), _ask_pipeline


def _ask_engine(engine: Any, question: str) -> Awaitable[Any]:
    return engine.aquery(question)


def _ask_pipeline(pipeline: Any, question: str) -> Awaitable[Any]:
    return pipeline.arun(question=question)


async def _measure(
    systems: dict[str, Any], ask: Ask, warmup: str, inputs: Sequence[str], concurrency: int, root_url: str
) -> tuple[dict[str, list[float]], dict[str, list[Any]], dict[str, float]]:
    return await measure_systems(
        {
            name: (
                lambda q, a=app: ask(a, q),
                lambda a=app: closed_loop(lambda q: _text(ask(a, q)), inputs, concurrency),
            )
            for name, app in systems.items()
        },
        warmup,
        root_url,
    )


async def _text(answer: Awaitable[Any]) -> str:
    """An app's answer as text (`str()` of a LlamaIndex response is its text): the answers compared."""
    return str(await answer)
