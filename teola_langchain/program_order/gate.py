"""How Teola sees the model calls a graph's nodes make: a callback handler per run.

Why callbacks: a node is the user's function, closing over the user's model; Teola cannot
swap the model without mutating the user's objects (its `rate_limiter` field is per
object), a wrapper would not be the object the function calls, and patching the model
classes would be global state. LangChain itself offers the hook: `register_configure_hook`
adds the handler held by a context variable to every callback manager configured while
the variable is set (its own usage and run collectors work this way). `OptimizedGraph` sets
the variable to the run's handler (`RunGate`) while LangGraph executes that run, so every model
call made by the run's nodes (with the node's config or none, in subgraphs too) reports
to it, and nothing outside the run does.

What the gate does with a call: with a bound on the model's calls in flight
(`model_concurrency`, learned from the model's server by default, see `admission.py`),
its `on_chat_model_start` / `on_llm_start` (awaited by LangChain before the model sends
its request) waits until Teola's scheduler admits the call; `on_llm_end` / `on_llm_error`
free its slot. Without one nothing would ever wait, so the run's handler only counts the
calls (`RunCalls`): no added latency. The request, the
answer and every other handler's callbacks are the model's own: the gate only delays
the start. It is added as a non-inheritable handler, so nodes never find it in their
config's callbacks, and it ignores chains, tools, agents and custom events.

Sync runs: LangChain runs an async handler method of a sync callback manager on a loop
of its own; the gate then waits for the admission made on the run's loop (Teola's loop
thread) through a thread-safe future, and its end callbacks hop to that loop. With the
learned bound ("auto") such a call is counted, not held: a sync model call made inside
an async run may block the run's own loop, where its admission would have to be made.
A call that never reports its end (a stream its caller abandoned) keeps its slot until
the run ends, when `close()` frees every slot of the run.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator, Mapping
from contextvars import ContextVar
from typing import Any, TypeVar
from urllib.parse import urlparse
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tracers.context import register_configure_hook

from teola_adapters.server_load import root_of
from teola_core.agents.token_rate import openai_usage
from teola_core.runtime.per_loop import running_loop
from teola_langchain.configure_hooks import holding
from teola_langchain.program_order.admission import AUTO, HeldCall, ModelAdmission
from teola_langchain.program_order.working_set import message_usage, messages_chars

T = TypeVar("T")
CURRENT_GATE: ContextVar[RunCalls | None] = ContextVar("teola_langgraph_gate", default=None)
register_configure_hook(CURRENT_GATE, inheritable=False)


class RunCalls(BaseCallbackHandler):
    """One graph run's model calls, counted; with no bound that is all (they go when made)."""

    run_inline = True  # bookkeeping: no executor hop
    raise_error = False  # a failure of Teola's admission is logged by LangChain; the call goes on
    ignore_chain = True
    ignore_agent = True
    ignore_retriever = True
    ignore_retry = True
    ignore_custom_event = True

    def __init__(self, run: str) -> None:
        self.run = run
        self._count = itertools.count(1)
        self.calls = 0  # model calls seen (admitted or waiting) so far

    def on_chat_model_start(self, serialized: dict[str, Any], messages: Any, *, run_id: UUID, **kwargs: Any) -> Any:
        self.calls = next(self._count)  # atomic: sync runs report from several threads

    def on_llm_start(self, serialized: dict[str, Any], prompts: Any, *, run_id: UUID, **kwargs: Any) -> Any:
        self.calls = next(self._count)

    def close(self) -> None:
        """The run ended."""


class RunGate(RunCalls):
    """One graph run's model calls, held until admitted (see the module docstring)."""

    def __init__(self, admission: ModelAdmission, loop: asyncio.AbstractEventLoop, rank: int, run: str) -> None:
        super().__init__(run)
        self.admission = admission
        self.loop = loop
        self.rank = rank
        self._held: dict[UUID, tuple[HeldCall, asyncio.Task[None]]] = {}

    # -- LangChain callbacks -------------------------------------------------------------
    async def on_chat_model_start(
        self, serialized: dict[str, Any], messages: Any, *, run_id: UUID, **kwargs: Any
    ) -> None:
        engine, server = model_engine(serialized, kwargs.get("metadata")), model_server(serialized)
        await self._enter(run_id, engine, server, chat_prompt_chars(messages))

    async def on_llm_start(self, serialized: dict[str, Any], prompts: Any, *, run_id: UUID, **kwargs: Any) -> None:
        engine, server = model_engine(serialized, kwargs.get("metadata")), model_server(serialized)
        await self._enter(run_id, engine, server, sum(len(p) for p in prompts if isinstance(p, str)))

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._on_loop(self._leave, run_id, reported_usage(response))

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._on_loop(self._leave, run_id)

    # -- holding -------------------------------------------------------------------------
    async def _enter(self, call: UUID, engine: str, server: str | None, chars: int) -> None:
        on_loop = running_loop() is self.loop
        if self.admission.passes(server) or (not on_loop and self.admission.concurrency == AUTO):
            # nothing to hold or learn; or (learned bound) a sync model call in an async run,
            # which may block the run's own loop: waiting for that loop would never end
            self.calls = next(self._count)
        elif on_loop:
            await self._hold(call, engine, server, chars)
        else:  # a sync callback manager runs this on a loop of its own
            hold = self._hold(call, engine, server, chars)
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(hold, self.loop))

    async def _hold(self, call: UUID, engine: str, server: str | None, chars: int) -> None:
        held = HeldCall.on_running_loop()
        self.calls = next(self._count)
        call_id = f"{self.run}/call{self.calls}"
        hold = self.admission.hold(
            engine, held, rank=self.rank, call_id=call_id, server=server, run=self.run, prompt_chars=chars
        )
        task = self.loop.create_task(hold)
        task.add_done_callback(lambda t: _admit_on_failure(t, held))
        self._held[call] = (held, task)
        try:
            await asyncio.shield(held.admitted)
        except BaseException:
            self._leave(call)
            raise

    def _leave(self, call: UUID, usage: tuple[int, int] | None = None) -> None:
        entry = self._held.pop(call, None)
        if entry is None:
            return
        held, task = entry
        held.usage = usage
        held.end()
        if not held.admitted.done():
            task.cancel()

    def _on_loop(self, fn: Any, *args: Any) -> None:
        if running_loop() is self.loop:
            fn(*args)
        else:
            self.loop.call_soon_threadsafe(fn, *args)

    def close(self) -> None:
        """The run ended: free the slots of calls that never reported their end (on the run's loop)."""
        for call in list(self._held):
            self._leave(call)
        self.admission.leave(self.run)


def chat_prompt_chars(messages: Any) -> int:
    """The characters of a chat call's prompt (`on_chat_model_start`'s message lists)."""
    return sum(messages_chars(batch) for batch in messages) if isinstance(messages, list) else 0


def reported_usage(response: Any) -> tuple[int, int] | None:
    """The prompt and answer tokens a model's answer (`LLMResult`) reports, if any: a chat
    message's `usage_metadata`, else the OpenAI-style `token_usage` of `llm_output`."""
    for generations in getattr(response, "generations", None) or ():
        for generation in generations:
            usage = message_usage(getattr(generation, "message", None))
            if usage is not None:
                return usage
    return openai_usage((getattr(response, "llm_output", None) or {}).get("token_usage"))


def model_engine(serialized: Mapping[str, Any] | None, metadata: Mapping[str, Any] | None) -> str:
    """The engine a model call goes to: one per model, named as LangChain's tracing names it.

    LangChain's standard tracing parameters (`ls_provider`, `ls_model_name`) identify the
    model a call is served by; the class path (from the serialized model) stands in when a
    model does not name itself. Calls of one model share its engine's slots, whichever
    object (or binding) made them.
    """
    meta = metadata or {}
    provider, name = meta.get("ls_provider"), meta.get("ls_model_name")
    if isinstance(provider, str) and isinstance(name, str):
        return f"llm:{provider}/{name}"
    ident = (serialized or {}).get("id")
    if isinstance(ident, list) and ident:
        return "llm:" + ".".join(str(part) for part in ident)
    return "llm:" + (provider if isinstance(provider, str) else "model")


async def gated_chunks(gate: RunCalls, chunks: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
    """`chunks` with `gate` held while the stream's steps run and while it is closed; each
    yield hands the caller's context back without it (a stream's consumer runs between)."""
    try:
        while True:
            with holding(CURRENT_GATE, gate):
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    return
            yield chunk
    finally:
        with holding(CURRENT_GATE, gate):
            await chunks.aclose()


def model_server(serialized: Mapping[str, Any] | None) -> str | None:
    """The root URL of the OpenAI-compatible server a model calls, from its serialized form.

    LangChain's OpenAI models serialize their `base_url` under `openai_api_base`, the
    field's own name in their `lc_attributes` (set only when given); a model without one
    (OpenAI's own API, other providers) has no server Teola can read.
    """
    base = ((serialized or {}).get("kwargs") or {}).get("openai_api_base")
    if not isinstance(base, str) or not base or urlparse(base).hostname == "api.openai.com":
        return None  # OpenAI's own API reports no load (as `prefix_warmup.openai_compatible` rules)
    return root_of(base)


def _admit_on_failure(task: asyncio.Task[None], held: HeldCall) -> None:
    """Teola's side of a call failed or was closed before admitting it: the call must not hang."""
    if held.admitted.done():
        return
    if task.cancelled():
        held.admitted.cancel()
    elif task.exception() is not None:
        held.admitted.set_exception(task.exception())  # raised in the callback, logged by LangChain
    else:
        held.admit()
