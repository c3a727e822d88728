"""The functions behind the tracer's `call` and condition nodes.

Two families:

- *structural* functions (`combine`, `merge`, `field`, `pick`, ...) reproduce what a
  LangChain composition primitive computes, line for line with its source, and run
  inline: they are cheap and pure.
- *user* functions (`run_step`, `choose_branch`, `run_map`) run the user's runnables
  themselves, with the query's config. In a sync query (`invoke`, `batch`, `stream`)
  the step's `invoke` runs in a worker thread, as LangChain's sync path does; in an
  async one, its `ainvoke` runs on the loop. Either way the step computes exactly what
  it computes inside the original chain.

Each factory returns a function taking the node's input ports as keyword arguments.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.utils import AddableDict

from teola_core.ir.errors import PrimitiveError
from teola_langchain.context import BoundConfigs, QueryContext
from teola_langchain.values import MISSING

if TYPE_CHECKING:
    from teola_langchain.tracer import SubGraph


ASSIGN_NOT_A_DICT = "The input to RunnablePassthrough.assign() must be a dict."


# -- structural (inline) ---------------------------------------------------------------
def constant(value: Any) -> Callable[[], Any]:
    def const() -> Any:
        return value

    return const


def combine(keys: Sequence[str]) -> Callable[..., dict[str, Any]]:
    """`RunnableParallel`'s output: a plain dict in the order of its steps."""
    ports = [f"p{i}" for i in range(len(keys))]

    def combined(**parts: Any) -> dict[str, Any]:
        return {key: parts[port] for key, port in zip(keys, ports, strict=True)}

    return combined


def merge(keys: Sequence[str]) -> Callable[..., dict[str, Any]]:
    """`RunnableAssign`'s output `{**value, **mapper_output}` for statically known new keys."""
    ports = [f"p{i}" for i in range(len(keys))]

    def merged(base: Any, **parts: Any) -> dict[str, Any]:
        return {**base, **{key: parts[port] for key, port in zip(keys, ports, strict=True)}}

    return merged


def merge_values(base: Any, update: Any) -> dict[str, Any]:
    """`{**value, **mapper_output}` when the mapper's output is a single value."""
    return {**base, **update}


def require_dict(value: Any) -> Any:
    """`RunnableAssign`'s check, made before its mapper runs."""
    if not isinstance(value, dict):
        raise ValueError(ASSIGN_NOT_A_DICT)
    return value


def get_or_missing(key: str) -> Callable[[Any], Any]:
    def get(value: Any) -> Any:
        return value.get(key, MISSING)

    return get


def pick_one(key: str) -> Callable[[Any], Any]:
    """`RunnablePick(keys=str)`: `value.get(key)` after the dict check."""

    def pick(value: Any) -> Any:
        if not isinstance(value, dict):
            raise ValueError(ASSIGN_NOT_A_DICT)
        return value.get(key)

    return pick


def pick_many(keys: Sequence[str]) -> Callable[[Any], Any]:
    """`RunnablePick(keys=list)`: an `AddableDict` of the present keys, or None."""
    wanted = list(keys)

    def pick(value: Any) -> Any:
        if not isinstance(value, dict):
            raise ValueError(ASSIGN_NOT_A_DICT)
        picked = {k: value.get(k) for k in wanted if k in value}
        return AddableDict(picked) if picked else None

    return pick


def apply(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A pure builtin applied to the value (`operator.itemgetter`)."""

    def applied(value: Any) -> Any:
        return fn(value)

    return applied


def unwrap_single(value: Any) -> Any:
    """The only element of a one-element list (a single query's search hits)."""
    (only,) = value
    return only


def as_list(value: Any) -> list[Any]:
    """A single query as the one-element batch an EMBED primitive takes."""
    return [value]


def identity(value: Any) -> Any:
    return value


def branch_index(value: int) -> int:
    return value


# -- user steps ------------------------------------------------------------------------
def run_step(step: Runnable[Any, Any], bound: BoundConfigs) -> Callable[..., Awaitable[Any]]:
    """Run the original runnable on its input with the query's config (sync or async path)."""

    async def run(value: Any, ctx: QueryContext) -> Any:
        config = ctx.step_config(bound)
        if ctx.sync:
            return await asyncio.to_thread(step.invoke, value, config)
        return await step.ainvoke(value, config)

    return run


def choose_branch(conditions: Sequence[Runnable[Any, Any]], bound: BoundConfigs) -> Callable[..., Awaitable[int]]:
    """`RunnableBranch`: the index of the first true condition, else the default's index.

    Conditions run one after another and stop at the first true one, as in LangChain.
    """

    async def choose(value: Any, ctx: QueryContext) -> int:
        for index, condition in enumerate(conditions):
            config = ctx.step_config(bound)
            if ctx.sync:
                result = await asyncio.to_thread(condition.invoke, value, config)
            else:
                result = await condition.ainvoke(value, config)
            if result:
                return index
        return len(conditions)

    return choose


def run_map(sub: SubGraph, bound: BoundConfigs) -> Callable[..., Awaitable[list[Any]]]:
    """`RunnableEach`: the traced body once per element, as concurrent queries.

    The elements run on the query's runtime (so their engine calls batch with each
    other), at most `max_concurrency` at a time when the config sets it, as the body's
    `batch` would. If elements fail, the first failing element's error is raised.
    """

    async def run(value: Any, ctx: QueryContext) -> list[Any]:
        config = ctx.step_config(bound)
        elements = list(value)
        limit = config.get("max_concurrency")
        semaphore = asyncio.Semaphore(limit) if limit else None

        async def one(element: Any) -> Any:
            child = ctx.child(RunnableConfig(**config))
            if semaphore is None:
                return await run_graph(sub, element, child)
            async with semaphore:
                return await run_graph(sub, element, child)

        results = await asyncio.gather(*(one(e) for e in elements), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return list(results)

    return run


async def run_graph(sub: SubGraph, value: Any, ctx: QueryContext) -> Any:
    """Run a traced graph for one input; raise the user's own exception if a step fails."""
    with ctx.registry.registered(ctx):
        try:
            outputs = await ctx.runtime.run(sub.graph, {"input": value, "context": ctx}, query_id=ctx.query_id)
        except PrimitiveError as exc:
            error = unwrap_error(exc)
        else:
            return outputs["output"]
    raise error


def unwrap_error(exc: BaseException) -> BaseException:
    """The exception the user's step raised, with a note naming the step that raised it."""
    while isinstance(exc, PrimitiveError):
        inner = exc.error
        inner.add_note(f"teola: raised in primitive {exc.node}")
        exc = inner
    return exc
