"""The functions behind the tracer's user nodes: leaves, composite runs, maps, retrievals.

Each factory returns an async function taking the node's input ports as keyword
arguments (`ctx` is the query's `QueryContext`). What each computes is what the LangChain
code it stands for computes, line for line: see `runs.py` for how steps are invoked and
how composite runs are opened and closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any
from uuid import uuid4

from langchain_core.callbacks import AsyncCallbackManager, CallbackManager
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import ensure_config

from teola_core.ir.errors import PrimitiveError
from teola_langchain.execution import runs
from teola_langchain.execution.context import OpenRun, QueryContext, StepRef
from teola_langchain.tracing.traced import SubGraph
from teola_langchain.tracing.values import MISSING

ASSIGN_NOT_A_DICT = "The input to RunnablePassthrough.assign() must be a dict."

Step = Callable[..., Awaitable[Any]]


# -- leaves ----------------------------------------------------------------------------
def leaf(step: Runnable[Any, Any], ref: StepRef) -> Step:
    """The step's own `invoke`/`ainvoke` with the config its composite gives it."""

    async def run(value: Any, ctx: QueryContext) -> Any:
        return await runs.invoke_step(ctx, ref, step, value)

    return run


@dataclass(frozen=True)
class ModelStep:
    """What a model's decode calls: the step's runnable (the model, or a binding around it)."""

    runnable: Runnable[Any, Any]
    ref: StepRef


# -- composite runs --------------------------------------------------------------------
def open_run(scope: str, ref: StepRef, name: str, *, streaming: bool = False) -> Step:
    """Open the composite's run for its input, and hand the input on to its children.

    streaming: open it before its input exists (it pipelines with the step before): its
    callbacks are recorded until `reach_open` gives its input (`runs.open_run`).
    """

    async def run(value: Any, ctx: QueryContext) -> Any:
        await runs.open_run(ctx, scope, ref, name, value, streaming=streaming)
        return value

    return run


def reach_open(scope: str) -> Callable[..., Any]:
    """The chain reached a run opened early (`open_run(streaming=True)`): `value` is its input."""

    def reach(value: Any, ctx: QueryContext) -> Any:
        return runs.reach_run(ctx, scope, value)

    return reach


def close_run(scope: str) -> Step:
    """End the run with its output (and its input, for a run opened `streaming`)."""

    async def run(value: Any, ctx: QueryContext, inputs: Any = runs.NO_INPUTS) -> Any:
        return await runs.close_run(ctx, scope, value, inputs)

    return run


def close_sliced_map(scope: str) -> Step:
    """End a pipelined map that follows a proven list slice (`components/slices.py`): the slice step's
    own output (`inputs`, the map's input) must be the items its body ran on."""

    async def run(value: Any, ctx: QueryContext, inputs: Any, items: list[Any]) -> Any:
        if not isinstance(inputs, list) or inputs != list(items):
            raise RuntimeError(
                f"teola: the step before the map returned {inputs!r}, not the slice of the model's items "
                f"{list(items)!r} its code proves; please report this chain"
            )
        return await runs.close_run(ctx, scope, value, inputs)

    return run


def close_dict(scope: str, keys: Sequence[str]) -> Step:
    """`RunnableParallel`'s output (a dict in the order of its steps), then its run ends."""
    ports = [f"p{i}" for i in range(len(keys))]

    async def run(ctx: QueryContext, **parts: Any) -> dict[str, Any]:
        output = {key: parts[port] for key, port in zip(keys, ports, strict=True)}
        return await runs.close_run(ctx, scope, output)

    return run


def close_merge(scope: str) -> Step:
    """`RunnableAssign`'s output `{**input, **mapper_output}`, then its run ends."""

    async def run(base: Any, update: Any, ctx: QueryContext) -> dict[str, Any]:
        return await runs.close_run(ctx, scope, {**base, **update})

    return run


def require_dict(value: Any) -> Any:
    """`RunnableAssign`'s check, made inside its run, before its mapper runs."""
    if not isinstance(value, dict):
        raise ValueError(ASSIGN_NOT_A_DICT)
    return value


def choose_branch(conditions: Sequence[Runnable[Any, Any]], scope: str) -> Step:
    """`RunnableBranch`: the index of the first true condition, else the default's index."""

    async def choose(value: Any, ctx: QueryContext) -> int:
        for index, condition in enumerate(conditions):
            if await runs.invoke_step(ctx, StepRef(scope, f"condition:{index + 1}"), condition, value):
                return index
        return len(conditions)

    return choose


def reach_step(step: int) -> Step:
    """Record that the query reached top-level step `step` of its sequence (which error a batch raises)."""

    def reach(value: Any, ctx: QueryContext) -> Any:
        ctx.step = step
        return value

    return reach


def branch_index(value: int) -> int:
    return value


def identity(value: Any) -> Any:
    return value


def get_or_missing(key: str) -> Callable[[Any], Any]:
    def get(value: Any) -> Any:
        return value.get(key, MISSING) if isinstance(value, dict) else MISSING

    return get


def constant(value: Any) -> Callable[[], Any]:
    def const() -> Any:
        return value

    return const


# -- maps ------------------------------------------------------------------------------
def batches_per_item(body: Runnable[Any, Any]) -> bool:
    """`body.batch(items)` computes `body.invoke(item)` for each item, independently.

    True for `Runnable`'s own `batch`/`abatch`, and for a plain sequence (stage by stage,
    one run per item) of such steps; False for a step with its own batch (a `BaseLLM`
    generates all prompts in one call, a fake model hands out answers in list order).
    """
    from langchain_core.runnables import RunnableBinding, RunnableSequence

    from teola_langchain.components.classes import class_of
    from teola_langchain.components.patched import runs_own_code

    while class_of(body) in (RunnableBinding,) and runs_own_code(body, RunnableBinding):
        body = body.bound  # type: ignore[attr-defined]
    if class_of(body) is RunnableSequence and runs_own_code(body, RunnableSequence):
        return all(batches_per_item(s) for s in body.steps)  # type: ignore[attr-defined]
    own = {**vars(body), **(getattr(body, "__pydantic_extra__", None) or {})}
    return (
        type(body).batch is Runnable.batch
        and type(body).abatch is Runnable.abatch
        and "batch" not in own
        and "abatch" not in own
    )


def run_map(sub: SubGraph) -> Step:
    """`RunnableEach` over a body whose batch is per item: the body's graph once per element.

    The elements run as nested queries on the query's runtime (so their engine calls batch
    with each other); as `Runnable.batch` does, the first failing element's error (in
    element order) is raised once every element has finished.
    """

    async def run(value: Any, ctx: QueryContext) -> list[Any]:
        elements = list(value)
        results = await asyncio.gather(*(run_graph(sub, e, ctx.child()) for e in elements), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return list(results)

    return run


def run_items(sub: SubGraph) -> Step:
    """A pipelined map's body on the items it is handed: the body's graph per item (`run_map`)."""
    each = run_map(sub)

    async def run(items: list[Any], ctx: QueryContext, after: Any = None) -> list[Any]:
        return await each(items, ctx)

    return run


async def run_graph(sub: SubGraph, value: Any, ctx: QueryContext) -> Any:
    """Run a traced graph for one input; on failure close its open runs and raise the step's error."""
    try:
        outputs = await ctx.runtime.run(
            sub.graph, {"input": value, "context": ctx}, query_id=ctx.query_id, arrival=ctx.arrival, context=ctx
        )
    except PrimitiveError as exc:
        error = unwrap_error(exc)
    except BaseException as exc:
        error = exc
    else:
        return outputs["output"]
    await runs.fail_runs(ctx, error)
    raise error


def unwrap_error(exc: BaseException) -> BaseException:
    """The exception a step raised (Teola's `PrimitiveError` around it removed)."""
    while isinstance(exc, PrimitiveError):
        exc = exc.error
    return exc


def invoke_items(body: Runnable[Any, Any], ref: StepRef) -> Step:
    """A map's body on each item (`Runnable.batch`: one `invoke` each), all at once."""

    async def run(items: list[Any], ctx: QueryContext, after: Any = None) -> list[Any]:
        return list(await asyncio.gather(*(runs.invoke_step(ctx, ref, body, item) for item in items)))

    return run


def as_list(value: Any) -> list[Any]:
    return [value]


def listed(value: Any) -> list[Any]:
    return list(value)


def only(value: list[Any]) -> Any:
    (one,) = value
    return one


# -- retrievals ------------------------------------------------------------------------
@dataclass(frozen=True)
class Retrieval:
    """A query whose retriever run is open (under `scope` in the query's runs)."""

    query: str
    scope: str


def start_retrievals(retriever: BaseRetriever, ref: StepRef) -> Step:
    """Open the retriever's run for each query, as `BaseRetriever.invoke` opens it."""

    async def run(items: list[str], ctx: QueryContext, after: Any = None) -> list[Retrieval]:
        started = []
        context = ctx.context_config(ref)
        for query in items:
            scope = f"retriever:{uuid4().hex}"
            ctx.runs[scope] = await runs.in_step(
                ctx,
                ref,
                partial(_retriever_start, retriever, query=query, context=context),
                partial(_aretriever_start, retriever, query=query, context=context),
            )
            started.append(Retrieval(query, scope))
        return started

    return run


def _retriever_manager_args(retriever: BaseRetriever, config: RunnableConfig) -> dict[str, Any]:
    return {
        "inheritable_callbacks": config.get("callbacks"),
        "local_callbacks": None,
        "verbose": False,
        "inheritable_tags": config.get("tags"),
        "local_tags": retriever.tags,
        "inheritable_metadata": {**(config.get("metadata") or {}), **retriever._get_ls_params()},
        "local_metadata": retriever.metadata,
    }


def _retriever_start(
    retriever: BaseRetriever, config: RunnableConfig, query: str, context: RunnableConfig | None
) -> OpenRun:
    config = ensure_config(config)
    manager = CallbackManager.configure(**_retriever_manager_args(retriever, config))
    run = manager.on_retriever_start(None, query, name=config.get("run_name") or retriever.get_name(), run_id=None)
    return OpenRun(run, config, None, kind="retriever", context=context)


async def _aretriever_start(
    retriever: BaseRetriever, config: RunnableConfig, query: str, context: RunnableConfig | None
) -> OpenRun:
    config = ensure_config(config)
    manager = AsyncCallbackManager.configure(**_retriever_manager_args(retriever, config))
    run = await manager.on_retriever_start(
        None, query, name=config.get("run_name") or retriever.get_name(), run_id=None
    )
    return OpenRun(run, config, None, kind="retriever", context=context)


def open_retriever(retriever: BaseRetriever, scope: str, ref: StepRef) -> Step:
    """Open one retriever run for the query, as `BaseRetriever.invoke` opens it; hand the query on."""

    async def run(value: Any, ctx: QueryContext) -> Any:
        context = ctx.context_config(ref)
        ctx.runs[scope] = await runs.in_step(
            ctx,
            ref,
            partial(_retriever_start, retriever, query=value, context=context),
            partial(_aretriever_start, retriever, query=value, context=context),
        )
        return value

    return run


def as_question(value: Any) -> dict[str, Any]:
    """What the multi-query retriever hands its `llm_chain`: `{"question": query}`."""
    return {"question": value}


def queries_of(items: list[Retrieval]) -> list[str]:
    return [r.query for r in items]


async def end_retrievals(items: list[Retrieval], hits: list[list[Document]], ctx: QueryContext) -> list[Any]:
    """End each retriever run with its documents; hand the documents on."""
    for started, docs in zip(items, hits, strict=True):
        await runs.close_run(ctx, started.scope, docs)
    return list(hits)
