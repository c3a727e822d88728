"""Running a chain's steps as LangChain runs them: same methods, configs, contexts and runs.

Leaves (a prompt, a lambda, a parser, an unknown runnable) run through their own public
method — `invoke` in a worker thread for a sync query, `ainvoke` on the loop for an async
one — with the config and context vars their composite would give them (`context.py`).

Composites (sequence, parallel, `.assign`, branch, `.map()`) are what Teola executes
itself, so it opens and closes their callback runs exactly as their code does:
`on_chain_start(None, input, name=config.get("run_name") or name, run_id=config.pop("run_id"))`
on the manager `get_callback_manager_for_config(ensure_config(config))` gives, then
`on_chain_end(output)`. A failed query closes its runs still open with
`on_chain_error(error)`, innermost first, as the exception would pass through them.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from functools import partial
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import (
    ensure_config,
    get_async_callback_manager_for_config,
    get_callback_manager_for_config,
)

from teola_core.engines.protocol import StreamResult
from teola_langchain.components.models import language_model
from teola_langchain.execution.context import Deferred, OpenRun, QueryContext, StepRef
from teola_langchain.execution.deferred_callbacks import CallbackRecorder, areplay, recording, replay, with_handlers


async def invoke_step(ctx: QueryContext, ref: StepRef, step: Runnable[Any, Any], value: Any) -> Any:
    """`step.invoke(value, config)` (sync query, worker thread) or `await step.ainvoke(...)`.

    In a `batch()` over a sequence, a step with its own `batch` runs it once for every
    input instead (`batching.py`).
    """
    config = ctx.step_config(ref)
    if ref.barrier is not None and ctx.batch is not None:
        return await ctx.batch.join(ref.barrier, ctx.batch_index, value, config, _batch_of(ctx, step))
    context = ctx.step_context(config, ref)
    try:
        if ctx.sync:
            return await asyncio.to_thread(context.run, step.invoke, value, config)
        return await asyncio.get_running_loop().create_task(step.ainvoke(value, config), context=context)
    except Exception:
        if ctx.early is not None and value is ctx.early.projection:
            ctx.early.read_failed = True  # its error may name keys the real input has (`tracing/early_steps.py`)
        raise


def _batch_of(ctx: QueryContext, step: Runnable[Any, Any]) -> Any:
    """`step.batch` (worker thread) or `step.abatch`, as the sequence's batch calls it."""
    return_exceptions = ctx.batch.return_exceptions if ctx.batch is not None else False

    async def run(values: list[Any], configs: list[RunnableConfig]) -> list[Any]:
        if ctx.sync:
            call = partial(step.batch, values, configs, return_exceptions=return_exceptions)
            return await asyncio.to_thread(ctx.caller.copy().run, call)
        task = step.abatch(values, configs, return_exceptions=return_exceptions)
        return await asyncio.get_running_loop().create_task(task, context=ctx.caller.copy())

    return run


async def invoke_streaming(
    ctx: QueryContext, ref: StepRef, step: Runnable[Any, Any], value: Any
) -> AsyncIterator[str | StreamResult]:
    """The model step's own `invoke`/`ainvoke`, its text as it is generated, then its output.

    A chat model streams inside `invoke` when a streaming callback handler is attached
    (what LangGraph's message streaming relies on): `TokenTap` is one, added for this
    call only, so the call and its run are the invoke LangChain makes, and its tokens
    reach Teola as they come. A model that cannot stream yields its text at the end, and
    so does one whose streamed run would differ from its plain one where a handler records
    it (`tap_leaves_same_run`).
    """
    if not tap_leaves_same_run(step, ctx.step_config(ref), ctx.caller):
        output = await invoke_step(ctx, ref, step, value)
        yield text_of(output)
        yield StreamResult(output)
        return
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str] = asyncio.Queue()
    tap = TokenTap(lambda token: loop.call_soon_threadsafe(queue.put_nowait, token))
    config = _with_handler(ctx.step_config(ref), tap)
    context = ctx.step_context(config, ref)
    if ctx.sync:
        call = asyncio.ensure_future(asyncio.to_thread(context.run, step.invoke, value, config))
    else:
        call = loop.create_task(step.ainvoke(value, config), context=context)
    streamed = False
    while not call.done() or not queue.empty():
        token = asyncio.ensure_future(queue.get())
        await asyncio.wait({token, call}, return_when=asyncio.FIRST_COMPLETED)
        if token.done():
            streamed = True
            yield token.result()
        else:
            token.cancel()
    if not streamed:  # the model did not stream: its whole text at once
        yield text_of(call.result())
    yield StreamResult(call.result())


def text_of(output: Any) -> str:
    """The text a model's output holds (a message's content, or an LLM's string)."""
    from langchain_core.messages import BaseMessage

    if isinstance(output, BaseMessage):
        return output.text if isinstance(output.text, str) else output.text()
    return output if isinstance(output, str) else str(output)


def tap_leaves_same_run(step: Runnable[Any, Any], config: RunnableConfig, caller: contextvars.Context) -> bool:
    """Whether tapping `step`'s tokens leaves the run LangChain would record.

    A tap makes a chat model call its streaming API, whose response can carry other
    metadata than its plain one (an OpenAI-compatible server's token usage and response
    id): that shows in the model's run whenever a handler records it. So the tap is
    faithful when the model streams in `invoke` anyway (`streaming=True`, a `stream`
    kwarg), when it is not a chat model (an LLM's `invoke` does not switch), or when no
    handler would record the run (none attached, or only Teola's own bookkeeping).
    LangSmith tracing switched on in the caller's context (`caller`) records it too.
    """
    from langchain_core.language_models import BaseChatModel
    from langchain_core.tracers.context import tracing_v2_callback_var
    from langsmith.utils import tracing_is_enabled

    model = language_model(step)
    if not isinstance(model, BaseChatModel) or streams_anyway(step, model):
        return True
    if caller.run(lambda: tracing_v2_callback_var.get() is not None or bool(tracing_is_enabled())):
        return False  # configuring the model's run adds LangSmith's tracer
    callbacks = config.get("callbacks")
    handlers = callbacks.handlers if isinstance(callbacks, BaseCallbackManager) else list(callbacks or [])
    return not any(records_runs(h) for h in handlers)


def streams_anyway(step: Runnable[Any, Any], model: Any) -> bool:
    """The chat model calls its streaming API in `invoke` whatever handlers are attached."""
    if getattr(model, "disable_streaming", False) is True:
        return False
    bound = getattr(step, "kwargs", None) if step is not model else None
    return bool((bound or {}).get("stream")) or (
        "streaming" in model.model_fields_set and getattr(model, "streaming", None) is True
    )


def records_runs(handler: BaseCallbackHandler) -> bool:
    """A handler that may record what a run returns (not one of Teola's structural ones)."""
    from teola_langchain.execution.deferred_callbacks import CallbackRecorder

    if isinstance(handler, CallbackRecorder):
        return any(records_runs(h) for h in handler.stands_for)
    return not getattr(handler, "teola_structure_only", False)


class TokenTap(BaseCallbackHandler):
    """Hands each new token of the call it is attached to to `on_token` (see `invoke_streaming`)."""

    run_inline = True  # in the model's own thread or task, in order
    teola_structure_only = True  # it records no run (`records_runs`)

    def __init__(self, on_token: Callable[[str], Any]) -> None:
        self._on_token = on_token

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self._on_token(token)

    def tap_output_iter(self, run_id: Any, output: Iterator[Any]) -> Iterator[Any]:
        return output  # marks a streaming handler; the tokens come through on_llm_new_token

    def tap_output_aiter(self, run_id: Any, output: AsyncIterator[Any]) -> AsyncIterator[Any]:
        return output


def _with_handler(config: RunnableConfig, handler: BaseCallbackHandler) -> RunnableConfig:
    """`config` with `handler` added for this call only (not inherited by anything it calls)."""
    callbacks = config.get("callbacks")
    if isinstance(callbacks, BaseCallbackManager):
        manager = callbacks.copy()
        manager.add_handler(handler, inherit=False)
        callbacks = manager
    else:
        callbacks = [*(callbacks or []), handler]
    return RunnableConfig(**{**config, "callbacks": callbacks})


async def in_step(
    ctx: QueryContext,
    ref: StepRef,
    sync_fn: Callable[[RunnableConfig], Any],
    async_fn: Callable[[RunnableConfig], Awaitable[Any]],
) -> Any:
    """Run `sync_fn(config)` or `async_fn(config)` as the step `ref` names would run (mode, context)."""
    config = ctx.step_config(ref)
    context = ctx.step_context(config, ref)
    if ctx.sync:
        return await asyncio.to_thread(context.run, sync_fn, config)
    return await asyncio.get_running_loop().create_task(async_fn(config), context=context)


NO_INPUTS: Any = object()  # `close_run` without an input to record (the run was opened with it)


async def open_run(
    ctx: QueryContext, scope: str, ref: StepRef, name: str, value: Any, *, streaming: bool = False
) -> None:
    """Open composite `name`'s run for `value` under `scope` (see the module docstring).

    streaming: the run opens before its input exists (a map pipelined with the model that
    writes its items): its callbacks, and those of everything under it, are recorded
    (`deferred_callbacks.py`) and handed to the handlers once the chain reaches it
    (`reach_run`), with its real input; if a step ahead fails first, they are dropped.
    """
    if ref.scope is None and not ref.bound and ctx.root_run is not None:
        ctx.runs[scope] = ctx.root_run  # the caller opened it (batch opens every root first)
        return
    recorder = CallbackRecorder() if streaming else None
    placeholder: dict[str, Any] = {"input": ""}  # what it is opened with, until `reach_run`
    given = placeholder if streaming else value

    def opened(run: Any, config: RunnableConfig, live: Any) -> OpenRun:
        deferred = None if recorder is None else Deferred(recorder, live, placeholder)
        return OpenRun(run, config, ref.scope, deferred=deferred)

    def start(config: RunnableConfig) -> OpenRun:
        config = ensure_config(config)
        live = get_callback_manager_for_config(config)
        manager = live if recorder is None else recording(live, recorder)
        run_name = config.get("run_name") or name
        run = manager.on_chain_start(None, given, name=run_name, run_id=config.pop("run_id", None))
        return opened(run, config, live)

    async def astart(config: RunnableConfig) -> OpenRun:
        config = ensure_config(config)
        live = get_async_callback_manager_for_config(config)
        manager = live if recorder is None else recording(live, recorder)
        run = await manager.on_chain_start(
            None, given, name=config.get("run_name") or name, run_id=config.pop("run_id", None)
        )
        return opened(run, config, live)

    ctx.runs[scope] = await in_step(ctx, ref, start, astart)


def reach_run(ctx: QueryContext, scope: str, value: Any) -> Any:
    """The chain reached the run opened early under `scope`: `value` is its input."""
    deferred = ctx.runs[scope].deferred
    if deferred is not None:
        deferred.input = value
    return value


async def call_manager(ctx: QueryContext, method: Callable[..., Any], *args: Any) -> Any:
    """A callback manager's `method(*args)` as the query's mode calls it: in a worker thread in
    a copy of the caller's context (sync query, sync manager), else awaited (async manager)."""
    if ctx.sync:
        return await asyncio.to_thread(ctx.caller.copy().run, method, *args)
    return await method(*args)


async def hand_on(ctx: QueryContext, recorder: CallbackRecorder, handlers: Any, swaps: dict[int, Any]) -> None:
    """Give `recorder`'s events to `handlers` as the query's managers would (values swapped by identity)."""
    await call_manager(ctx, replay if ctx.sync else areplay, recorder, handlers, swaps)


async def _hand_on_deferred(ctx: QueryContext, deferred: Deferred) -> None:
    """Give a run's recorded callbacks to the handlers it stood for, its input swapped in."""
    await hand_on(ctx, deferred.recorder, deferred.live.handlers, {id(deferred.placeholder): deferred.input})


async def close_run(ctx: QueryContext, scope: str, output: Any, inputs: Any = NO_INPUTS) -> Any:
    """End the run of `scope` with `output` (unless the caller owns it) and hand `output` on;
    a run opened early (`open_run(streaming=True)`) is reached with `inputs` first."""
    run = ctx.runs.pop(scope)
    if run is ctx.root_run:
        return output
    end = run.end
    if run.deferred is not None:
        run.deferred.input = inputs
        await _hand_on_deferred(ctx, run.deferred)
        end = with_handlers(run.manager, run.deferred.live).on_chain_end
    await call_manager(ctx, end, output)
    return output


async def fail_runs(ctx: QueryContext, error: BaseException) -> None:
    """Close every run the query still has open with `error`, innermost (latest) first.

    A run opened early that the chain never reached is dropped, with everything recorded
    under it: plain LangChain would not have started it."""
    own = ctx.own_runs()
    for scope in reversed(list(own)):
        run = own.pop(scope)
        if run is ctx.root_run:
            continue
        fail = run.error
        if run.deferred is not None:
            if not run.deferred.reached:
                continue
            await _hand_on_deferred(ctx, run.deferred)
            fail = with_handlers(run.manager, run.deferred.live).on_chain_error
        await call_manager(ctx, fail, error)
