"""`batch`/`abatch` on Teola's graph, with LangChain's batch contract.

Every input runs as a concurrent query on one runtime (so the engine schedulers can batch
across them), at most `max_concurrency` at once. Over a sequence (`RunnableSequence.batch`)
every input's run is opened first, and the inputs of a step with its own `batch` meet at
a barrier (`batching.py`). Errors are returned in place (`return_exceptions=True`) or the
error LangChain would raise is raised: the first failing step, then the first input.

    roots = open_roots(chain, inputs, configs)        # over a sequence only, else None
    results, raised = await run_queries(graph, runtimes, inputs, configs, True, caller, roots, False)
    return batch_results(results, raised, roots)      # ends the roots' runs; raises `raised`
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Sequence
from typing import Any
from uuid import uuid4

from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import CallbackManager, get_async_callback_manager_for_config

from teola_core.runtime.backends import RuntimePerLoop
from teola_langchain.execution.batching import BatchGroup
from teola_langchain.execution.context import OpenRun, QueryContext, now_on
from teola_langchain.execution.steps import run_graph
from teola_langchain.tracing.traced import SubGraph


def open_roots(chain: Runnable[Any, Any], inputs: list[Any], configs: list[RunnableConfig]) -> list[OpenRun]:
    """Every input's sequence run, opened before any step runs (`RunnableSequence.batch`)."""
    roots = []
    for value, config in zip(inputs, configs, strict=True):
        manager = CallbackManager.configure(
            inheritable_callbacks=config.get("callbacks"),
            inheritable_tags=config.get("tags"),
            inheritable_metadata=config.get("metadata"),
        )
        run = manager.on_chain_start(
            None, value, name=config.get("run_name") or chain.get_name(), run_id=config.pop("run_id", None)
        )
        roots.append(OpenRun(run, config, None))
    return roots


async def aopen_roots(chain: Runnable[Any, Any], inputs: list[Any], configs: list[RunnableConfig]) -> list[OpenRun]:
    roots = []
    for value, config in zip(inputs, configs, strict=True):
        manager = get_async_callback_manager_for_config(config)
        run = await manager.on_chain_start(
            None, value, name=config.get("run_name") or chain.get_name(), run_id=config.pop("run_id", None)
        )
        roots.append(OpenRun(run, config, None))
    return roots


async def run_queries(
    graph: SubGraph,
    runtimes: RuntimePerLoop,
    inputs: Sequence[Any],
    configs: Sequence[RunnableConfig],
    sync: bool,
    caller: contextvars.Context,
    roots: list[OpenRun] | None,
    return_exceptions: bool,
) -> tuple[list[Any], BaseException | None]:
    """Every input as a query; (results or errors in place, the error the batch raises)."""
    limit = configs[0].get("max_concurrency")
    semaphore = asyncio.Semaphore(limit) if limit else None
    group = BatchGroup(len(inputs), return_exceptions) if roots is not None else None
    runtime = runtimes.current()
    arrived = now_on(runtime)  # one batch: its queries arrive together, ties in input order
    contexts = [
        QueryContext(
            uuid4().hex,
            configs[i],
            sync,
            caller.copy(),
            runtime,
            root_run=None if roots is None else roots[i],
            batch=group,
            batch_index=i,
            arrival=arrived,
        )
        for i in range(len(inputs))
    ]

    async def one(i: int) -> Any:
        try:
            if semaphore is None:
                return await run_graph(graph, inputs[i], contexts[i])
            async with semaphore:
                return await run_graph(graph, inputs[i], contexts[i])
        except BaseException:
            if group is not None:
                group.leave(i)
            raise

    results = list(await asyncio.gather(*(one(i) for i in range(len(inputs))), return_exceptions=True))
    failed = [
        (contexts[i].step, i)
        for i, r in enumerate(results)
        if isinstance(r, BaseException) and (not return_exceptions or not isinstance(r, Exception))
    ]
    return results, results[min(failed)[1]] if failed else None


def batch_results(results: list[Any], raised: BaseException | None, roots: list[OpenRun] | None) -> list[Any]:
    """End every root run (with its error, or the batch's), then raise the batch's error or return."""
    if roots is not None:
        for run, result in zip(roots, results, strict=True):
            error = raised or (result if isinstance(result, BaseException) else None)
            if error is not None:
                run.manager.on_chain_error(error)
            else:
                run.manager.on_chain_end(result)
    if raised is not None:
        raise raised
    return results


async def abatch_results(results: list[Any], raised: BaseException | None, roots: list[OpenRun] | None) -> list[Any]:
    if roots is not None:
        ends = []
        for run, result in zip(roots, results, strict=True):
            error = raised or (result if isinstance(result, BaseException) else None)
            ends.append(run.manager.on_chain_error(error) if error is not None else run.manager.on_chain_end(result))
        await asyncio.gather(*ends)
    if raised is not None:
        raise raised
    return results
