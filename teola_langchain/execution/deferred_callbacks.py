"""Callbacks held back while a step runs early, and handed to the real handlers when it is due.

A step that starts before the step ahead of it has ended (`tracing/early_steps.py`) runs with a
`CallbackRecorder` in place of the handlers its callback manager would have. When the
step ahead ends and the chain reaches it, `replay` gives every recorded event to those
handlers, as LangChain's managers give them (`handle_event`: ignore flags, the chat-model
fallback, async handlers), with the early input swapped for the step's real input. If
the step ahead fails, the recording is dropped: the handlers never see a step that plain
LangChain would not have run.

    recorder = CallbackRecorder()
    config = patch_config(config, callbacks=recording(manager, recorder))   # the step runs with it
    replay(recorder, handlers, {id(projection): real_input})                # when it is due
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager
from langchain_core.callbacks.manager import BaseRunManager, ahandle_event, handle_event
from langchain_core.tracers.context import tracing_v2_callback_var

# Every event a manager hands its handlers, and the handler flag that skips it.
IGNORE_FLAG: dict[str, str | None] = {
    "on_llm_start": "ignore_llm",
    "on_chat_model_start": "ignore_chat_model",
    "on_llm_new_token": "ignore_llm",
    "on_llm_end": "ignore_llm",
    "on_llm_error": "ignore_llm",
    "on_stream_event": "ignore_llm",
    "on_chain_start": "ignore_chain",
    "on_chain_end": "ignore_chain",
    "on_chain_error": "ignore_chain",
    "on_tool_start": "ignore_agent",
    "on_tool_end": "ignore_agent",
    "on_tool_error": "ignore_agent",
    "on_agent_action": "ignore_agent",
    "on_agent_finish": "ignore_agent",
    "on_retriever_start": "ignore_retriever",
    "on_retriever_end": "ignore_retriever",
    "on_retriever_error": "ignore_retriever",
    "on_retry": "ignore_retry",
    "on_custom_event": "ignore_custom_event",
    "on_text": None,
}


@dataclass(frozen=True)
class Event:
    """One handler call, as a manager made it."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class CallbackRecorder(BaseCallbackHandler):
    """Records every event it is given, in order (it ignores nothing, and runs inline)."""

    run_inline = True

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.stands_for: list[BaseCallbackHandler] = []  # the handlers the events will go to


def _recording(name: str) -> Any:
    def record(self: CallbackRecorder, *args: Any, **kwargs: Any) -> None:
        self.events.append(Event(name, args, kwargs))

    record.__name__ = name
    return record


for _name in IGNORE_FLAG:  # one recording method per event, so no manager falls back to another event
    setattr(CallbackRecorder, _name, _recording(_name))


def recording(manager: BaseCallbackManager, recorder: CallbackRecorder) -> BaseCallbackManager:
    """`manager` (a step's callback manager) with `recorder` as its only handler, inherited by every run under it."""
    if not recorder.stands_for:
        recorder.stands_for = list(manager.handlers)
    copy = manager.copy()
    copy.handlers = [recorder]
    copy.inheritable_handlers = [recorder]
    return copy


def is_recording(manager: Any, recorder: CallbackRecorder) -> bool:
    return isinstance(manager, BaseCallbackManager) and manager.handlers == [recorder]


def records_only(manager: BaseCallbackManager) -> bool:
    """Every handler of `manager` is a recorder: what runs under it is recorded, not delivered."""
    return bool(manager.handlers) and all(isinstance(h, CallbackRecorder) for h in manager.handlers)


def with_handlers(run: BaseRunManager, like: BaseCallbackManager) -> BaseRunManager:
    """The run manager `run`, recorded, as it would be with the handlers of `like` (the live manager it came from)."""
    return type(run)(
        run_id=run.run_id,
        handlers=list(like.handlers),
        inheritable_handlers=list(like.inheritable_handlers),
        parent_run_id=run.parent_run_id,
        tags=run.tags,
        inheritable_tags=run.inheritable_tags,
        metadata=run.metadata,
        inheritable_metadata=run.inheritable_metadata,
    )


def without_tracing() -> None:
    """In the current context, configuring a manager adds no LangSmith tracer of its own (the
    recorder stands for the handlers, the tracer among them): run it as `context.run(without_tracing)`
    in a step's own copy of its caller's context."""
    from langsmith.run_helpers import tracing_context

    tracing_v2_callback_var.set(None)
    tracing_context(enabled=False).__enter__()  # left entered: the context is this step's own copy


def _swapped(value: Any, swaps: Mapping[int, Any]) -> Any:
    return swaps.get(id(value), value)


def _args(event: Event, swaps: Mapping[int, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    args = tuple(_swapped(a, swaps) for a in event.args)
    kwargs = {k: _swapped(v, swaps) for k, v in event.kwargs.items()}
    return args, kwargs


def replay(recorder: CallbackRecorder, handlers: list[BaseCallbackHandler], swaps: Mapping[int, Any]) -> None:
    """Hand every recorded event to `handlers` (a sync manager's way), values swapped by identity."""
    for event in recorder.events:
        args, kwargs = _args(event, swaps)
        handle_event(handlers, event.name, IGNORE_FLAG[event.name], *args, **kwargs)


async def areplay(recorder: CallbackRecorder, handlers: list[BaseCallbackHandler], swaps: Mapping[int, Any]) -> None:
    """`replay` as an async manager hands events on."""
    for event in recorder.events:
        args, kwargs = _args(event, swaps)
        await ahandle_event(handlers, event.name, IGNORE_FLAG[event.name], *args, **kwargs)
