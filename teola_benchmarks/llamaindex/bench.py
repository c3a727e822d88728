"""`teola bench --llamaindex EXAMPLE`: an example LlamaIndex app, its own execution vs Teola.

    result = bench_llamaindex("fusion_query_engine", queries=16, concurrency=4)
    result.speedups()["llamaindex"], result.server["alone_s"]

QueryPipelines (`examples`, llama-index-core <= 0.12), query engines (`query_engines`,
both lines) or workflows (`workflows`, 0.14: `await workflow.run(topic=question)`, its
LLM an `OpenAILike` client, so Teola watches the server's load) on one set of simulated
servers, each system a closed loop of `concurrency` workers; answers (as text) must
equal LlamaIndex's (`AnswerMismatch`). `max_num_seqs`: the LLM server runs at most that
many requests at once (vLLM's option; Teola learns it from `/metrics`), else all. How
each system is driven: `docs/benchmarks.md`. Needs fastapi, uvicorn and openai
(workflows: llama-index-llms-openai-like too).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import teola
from teola_adapters.simulated.servers import Batching, SimServers
from teola_benchmarks.app_names import LLAMAINDEX_EXAMPLES, LLAMAINDEX_WORKFLOWS
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
    max_num_seqs: int | None = None,
) -> FrameworkBenchResult:
    """Run both systems on one example against one set of servers (see the module docstring)."""
    if example not in LLAMAINDEX_EXAMPLES:
        raise ValueError(f"unknown example {example!r} (known: {', '.join(LLAMAINDEX_EXAMPLES)})")
    check_sizes(queries, concurrency)
    inputs = questions(queries + 1)
    warmup, measured = inputs[0], inputs[1:]
    with SimServers(time_scale=time_scale, batching=batching, max_num_seqs=max_num_seqs) as servers:
        app, ask = _build(example, servers.base_url)
        fast = teola.optimize(app)
        try:
            latencies, answers, alone = asyncio.run(
                _measure({"llamaindex": app, "teola": fast}, ask, warmup, measured, concurrency, servers.root_url)
            )
            watched = load_watches(fast)
        finally:
            fast.close()
    check_equal(example, measured, answers, "llamaindex")
    server = {**server_figures(servers.backend, alone), "max_num_seqs": max_num_seqs, "teola_load_watch": watched}
    return FrameworkBenchResult(example, queries, concurrency, time_scale, batching, latencies, server)


def _build(example: str, base_url: str) -> tuple[Any, Ask]:
    """The example's app on the servers at `base_url` and how to ask it: a query engine, a
    workflow (imported only then: 0.14) or a QueryPipeline (imported only then: <= 0.12)."""
    if example in LLAMAINDEX_WORKFLOWS:
        try:
            from teola_benchmarks.llamaindex.workflows import WORKFLOWS
        except ImportError as exc:
            raise ModuleNotFoundError(
                f"example {example!r} is a Workflow, which needs llama-index-core 0.14 and "
                f"llama-index-llms-openai-like ({exc})"
            ) from exc
        return WORKFLOWS[example](base_url), _ask_workflow
    llm = ServerLLM(base_url=base_url)
    index = build_index(ServerEmbedding(base_url=base_url))
    if example in QUERY_ENGINES:
        return QUERY_ENGINES[example](llm, index), _ask_engine
    try:
        from teola_benchmarks.llamaindex.examples import EXAMPLES
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"example {example!r} is a QueryPipeline, which needs llama-index-core <= 0.12 ({exc})"
        ) from exc
    return EXAMPLES[example](llm, index), _ask_pipeline


def load_watches(fast: Any) -> list[dict[str, Any]]:
    """What Teola learned of each LLM server whose load it watched (`teola_adapters.server_load`):
    whether it is vLLM-like, the requests it runs at once, the calls Teola held; none for an
    LLM it does not watch (the bench's `ServerLLM`)."""
    engines = getattr(getattr(fast, "engines", None), "engines", {})
    return [
        {
            "server": watch.root_url,
            "vllm": calls.vllm,
            "capacity": calls.limit.capacity,
            "held_total": calls.held_total,
        }
        for engine in engines.values()
        if (watch := getattr(engine, "load_watch", None)) is not None
        for calls in list(getattr(watch, "attached", ()))
    ]


def _ask_engine(engine: Any, question: str) -> Awaitable[Any]:
    return engine.aquery(question)


def _ask_pipeline(pipeline: Any, question: str) -> Awaitable[Any]:
    return pipeline.arun(question=question)


def _ask_workflow(workflow: Any, question: str) -> Awaitable[Any]:
    return workflow.run(topic=question)  # the run's handler: awaited, the StopEvent's result


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
