"""`teola bench --langchain EXAMPLE`: an example chain, plain LangChain vs `teola.optimize`.

    result = bench_langchain("assign_pipeline", queries=16, concurrency=4)
    result.best_baseline(), result.speedups(), result.server["alone_s"]

Systems on one set of simulated servers, one after the other, the same inputs:
`langchain` (`ainvoke`, a closed loop of `concurrency` workers), `langchain_abatch`,
`langchain_<spelling>` for each of the example's `PLAIN_SPELLINGS` (the same chain written
another way), and `teola`. Every system runs with a tracer attached (`traces.TraceRecorder`,
as a LangSmith user's would be): answers must equal LangChain's (`AnswerMismatch`), and so
must the finished traces of `teola` and `langchain` (`TraceMismatch`). Overhead mode:
`overhead_langchain` on zero-latency fakes. How each system is driven and what `alone_s`
is: `docs/benchmarks.md`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any

from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.runnables import Runnable

import teola
from teola_adapters.simulated.servers import Batching, SimServers
from teola_benchmarks.app_names import LANGCHAIN_EXAMPLES as EXAMPLES
from teola_benchmarks.app_names import import_example
from teola_benchmarks.framework_result import (
    AnswerMismatch,
    FrameworkBenchResult,
    TeolaVsLangChain,
    check_equal,
    server_figures,
)
from teola_benchmarks.framework_runs import Run, alternating_rounds, check_sizes, closed_loop, measure_systems
from teola_benchmarks.langchain.fakes import LocalReranker, ResponderChat
from teola_benchmarks.langchain.traces import TraceRecorder, first_difference

SYSTEMS = ("langchain", "langchain_abatch", "teola")


class TraceMismatch(AssertionError):
    """Teola's finished traces differ from LangChain's for the same inputs."""


def example_module(name: str) -> ModuleType:
    """The `--langchain` example `name` (`teola_examples.<name>`)."""
    return import_example(name, EXAMPLES)


def bench_langchain(
    example: str,
    *,
    queries: int = 16,
    concurrency: int = 4,
    time_scale: float = 0.5,
    batching: Batching = "dynamic",
    options: dict[str, Any] | None = None,
    traced: bool = True,
    max_num_seqs: int | None = None,
) -> FrameworkBenchResult:
    """Run the three systems on one example against one set of servers (see the module docstring).

    max_num_seqs: the LLM server runs at most this many requests at once (vLLM's option;
    the rest queue there); Teola is not told it, it reads the server's `/metrics`.
    """
    check_sizes(queries, concurrency)
    module = example_module(example)
    from teola_examples.common import HTTPReranker, corpus, openai_models

    inputs = module.inputs(queries + 1)
    warmup, measured = inputs[0], inputs[1:]
    with SimServers(time_scale=time_scale, batching=batching, max_num_seqs=max_num_seqs) as servers:
        llm, embeddings = openai_models(servers.base_url)
        parts = {"corpus": corpus(), "reranker": HTTPReranker(servers.base_url)}
        chain = module.build_chain(llm, embeddings, **parts)
        spellings = {
            name: build(llm, embeddings, **parts) for name, build in getattr(module, "PLAIN_SPELLINGS", {}).items()
        }
        fast = teola.optimize(chain, **{**module.OPTIMIZE_OPTIONS, **(options or {})})
        try:
            run = _measure(
                chain, fast, warmup, measured, concurrency, servers.root_url, spellings, (llm, embeddings), traced
            )
            latencies, answers, alone, traces = asyncio.run(run)
        finally:
            fast.close()
    check_equal(example, measured, answers, "langchain")
    expected, got = traces["langchain"].trees(), traces["teola"].trees()
    if expected != got:
        raise TraceMismatch(f"{example}: teola's traces differ from langchain's: {first_difference(expected, got)}")
    server = {**server_figures(servers.backend, alone), "max_num_seqs": max_num_seqs}
    return FrameworkBenchResult(example, queries, concurrency, time_scale, batching, latencies, server)


async def _measure(
    chain: Runnable[Any, Any],
    fast: Runnable[Any, Any],
    warmup: Any,
    inputs: Sequence[Any],
    concurrency: int,
    root_url: str,
    spellings: dict[str, Runnable[Any, Any]],
    clients: Sequence[Any] = (),
    traced: bool = True,
) -> tuple[dict[str, list[float]], dict[str, list[Any]], dict[str, float], dict[str, TraceRecorder]]:
    systems: dict[str, Runnable[Any, Any]] = {
        "langchain": chain,
        "langchain_abatch": chain,
        **{f"langchain_{name}": spelled for name, spelled in spellings.items()},
        "teola": fast,
    }
    traces = {name: TraceRecorder() for name in systems}
    configs = {name: {"callbacks": [recorder]} if traced else {} for name, recorder in traces.items()}
    asks = {name: partial(systems[name].ainvoke, config=configs[name]) for name in systems}
    runs: dict[str, Run] = {
        name: (
            (lambda r=systems[name], c=configs[name]: _batches(r, inputs, concurrency, c))
            if name == "langchain_abatch"
            else (lambda ask=asks[name]: closed_loop(ask, inputs, concurrency))
        )
        for name in systems
    }
    measured = await measure_systems({name: (asks[name], run) for name, run in runs.items()}, warmup, root_url)
    for component in clients:  # closed on this loop, not when collected after it (another example's run)
        await _close_async_client(component)
    return (*measured, traces)


async def _close_async_client(component: Any) -> None:
    """Close the async OpenAI client of a langchain-openai model or embeddings object, if it has one."""
    for attr in ("root_async_client", "async_client"):
        client = getattr(component, attr, None)
        client = getattr(client, "_client", client)  # a resource (`AsyncEmbeddings`) holds its client
        close = getattr(client, "close", None)
        if close is not None:
            await close()


async def _batches(
    runnable: Runnable[Any, Any], inputs: Sequence[Any], size: int, config: Any = None
) -> tuple[list[float], list[Any]]:
    """`abatch` on `size` queries at a time; each query's latency is its batch call's."""
    latencies: list[float] = []
    outputs: list[Any] = []
    for start in range(0, len(inputs), size):
        chunk = list(inputs[start : start + size])
        began = time.perf_counter()
        outputs.extend(await runnable.abatch(chunk, config))
        latencies.extend([time.perf_counter() - began] * len(chunk))
    return latencies, outputs


@dataclass(frozen=True)
class LangChainOverhead(TeolaVsLangChain):
    example: str
    queries: int
    rounds: int
    langchain_s: float  # mean seconds per invoke
    teola_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "example": self.example,
            "mode": "overhead",
            "queries": self.queries,
            "rounds": self.rounds,
            "systems": {"langchain": {"mean_s": self.langchain_s}, "teola": {"mean_s": self.teola_s}},
            "ratio": self.ratio,
        }


def overhead_langchain(example: str, *, queries: int = 20, rounds: int = 5) -> LangChainOverhead:
    """`optimize(chain).invoke` vs `chain.invoke` on zero-latency fakes, sequential calls."""
    module = example_module(example)
    from teola_examples.common import corpus

    chain = module.build_chain(
        ResponderChat(), DeterministicFakeEmbedding(size=64), corpus=corpus(), reranker=LocalReranker()
    )
    fast = teola.optimize(chain, **module.OPTIMIZE_OPTIONS)
    inputs = module.inputs(queries)
    try:
        for x in inputs[:2]:  # warm-up: first-call costs (thread start, imports) are not per-call overhead
            if chain.invoke(x) != fast.invoke(x):
                raise AnswerMismatch(f"{example}: teola and langchain differ on {x!r}")
        seconds = alternating_rounds(
            {"langchain": lambda: _invoke_each(chain, inputs), "teola": lambda: _invoke_each(fast, inputs)}, rounds
        )
    finally:
        fast.close()
    n = queries * rounds
    return LangChainOverhead(example, queries, rounds, sum(seconds["langchain"]) / n, sum(seconds["teola"]) / n)


def _invoke_each(runnable: Runnable[Any, Any], inputs: Sequence[Any]) -> None:
    """One sequential `invoke` per input (the outputs are checked in the warm-up, not here)."""
    for x in inputs:
        runnable.invoke(x)
