"""LangChain's `SummarizationMiddleware`, summarized ahead: while the tools run, not in `before_model`.

The middleware decides in `before_model` whether the conversation is over its budget and,
if so, summarizes `messages[:cutoff]` there, on the critical path. While a turn's tools
run, the messages that `before_model` will see are already known but for the tools'
contents: the state's messages plus one `ToolMessage` per tool call of the last
`AIMessage`. `summary_ahead` answers, from that prediction alone, whether the middleware
will summarize and which messages; the optimized agent then starts the middleware's own
`_acreate_summary` on them (`Program.compact_ahead`). The middleware's `_create_summary` /
`_acreate_summary` are wrapped (`install_hooks`) so that, inside an optimized run, they ask
the run for the summary (`Program.compacted`): the one computed ahead when it is for
exactly the same messages (`summary_key`: ids and contents), else computed now, as
LangChain would. Outside an optimized run the wrappers call the middleware's own method.

When it speculates (all must hold; anything else, or a LangChain without these private
methods, means no speculation, never a different answer):

- the agent has exactly one `SummarizationMiddleware` whose class keeps LangChain's
  `_create_summary` / `_acreate_summary` (a summary that is a function of its messages);
- the tool call belongs to the last message, an `AIMessage` whose tool calls all have ids,
  and not every one of them is a `return_direct` tool (the agent would end);
- the trigger provably fires after the tools: `_should_summarize(predicted, tokens)`, where
  `tokens` is the count of the messages known now if the token counter only grows when
  messages are appended (LangChain's approximate counter: a non-negative count per
  message, scaled by a factor in [1, 1.25] set by the last `AIMessage`, which tool
  results do not change), else 0 (token triggers then fire only on reported usage, read
  from that same last `AIMessage`); message counts are exact; triggers only grow with
  these inputs, so a trigger that holds for the prediction holds for the real messages;
- `keep` counts messages (a token budget's cutoff depends on the tools' contents), the
  cutoff is within the messages known now, and those all have ids (else `before_model`
  would give them new ones);
- in sync runs, only a chat model writes summaries (a custom `summarizer` may have no
  sync form, or another one: speculation runs its async form).
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from langchain.agents.middleware import SummarizationMiddleware
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately
from langgraph.prebuilt.tool_node import ToolCallRequest

TRIGGER_KINDS = frozenset({"messages", "tokens", "fraction"})
"""The trigger kinds whose growth under appended tool results is argued in the module docstring."""

_PRIVATE_API = {
    "_should_summarize": ("self", "messages", "total_tokens"),
    "_determine_cutoff_index": ("self", "messages"),
    "_create_summary": ("self", "messages_to_summarize"),
    "_acreate_summary": ("self", "messages_to_summarize"),
}
"""The middleware's private methods used here, with their parameters in the LangChain this was written for."""


@dataclass(frozen=True)
class SummaryAhead:
    """The summary to start now: of exactly `messages`, identified by `key`, by `create`."""

    key: str
    messages: list[AnyMessage]
    create: Callable[[list[AnyMessage]], Awaitable[str]]  # the middleware's own `_acreate_summary`

    def summarize(self) -> Awaitable[str]:
        return self.create(self.messages)


@dataclass(frozen=True)
class ToolTurn:
    """The agent's messages while a turn's tools run: the last is the `AIMessage` calling them."""

    messages: list[AnyMessage]
    call_ids: list[str]
    call_names: list[str]

    @property
    def id(self) -> str | None:
        return self.messages[-1].id


class SummaryRoute(Protocol):
    """An optimized run, asked for the summary the middleware is about to create."""

    def summary(self, messages: list[AnyMessage], create: Callable[[list[AnyMessage]], str]) -> str: ...

    async def asummary(
        self, messages: list[AnyMessage], create: Callable[[list[AnyMessage]], Awaitable[str]]
    ) -> str: ...


Router = Callable[[SummarizationMiddleware], SummaryRoute | None]
"""Finds the optimized run (if any) that is running the middleware now."""


def find_summarization(agent: Any) -> SummarizationMiddleware | None:
    """The agent's one `SummarizationMiddleware` that can be summarized ahead, if any."""
    found: list[SummarizationMiddleware] = []
    for spec in agent.builder.nodes.values():
        for func in (getattr(spec.runnable, "func", None), getattr(spec.runnable, "afunc", None)):
            owner = getattr(func, "__self__", None)
            if isinstance(owner, SummarizationMiddleware) and owner not in found:
                found.append(owner)
    if len(found) != 1:
        return None
    (middleware,) = found
    cls = type(middleware)
    if not all(_parameters(getattr(cls, name, None)) == params for name, params in _PRIVATE_API.items()):
        return None  # another LangChain version: no speculation
    if cls._create_summary is not SummarizationMiddleware._create_summary:
        return None
    if cls._acreate_summary is not SummarizationMiddleware._acreate_summary:
        return None
    return middleware


def _parameters(method: Any) -> tuple[str, ...] | None:
    if not callable(method):
        return None
    return tuple(inspect.signature(method).parameters)


def tool_turn(request: ToolCallRequest) -> ToolTurn | None:
    """The turn a tool call belongs to, if its state ends with the `AIMessage` that made it."""
    state = request.state
    messages = state.get("messages") if isinstance(state, Mapping) else getattr(state, "messages", None)
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], AIMessage):
        return None
    calls = messages[-1].tool_calls
    ids = [call.get("id") for call in calls]
    if not all(isinstance(i, str) and i for i in ids) or request.tool_call.get("id") not in ids:
        return None
    return ToolTurn(list(messages), [str(i) for i in ids], [call["name"] for call in calls])


def summary_ahead(
    middleware: SummarizationMiddleware, turn: ToolTurn, direct_tools: frozenset[str] = frozenset()
) -> SummaryAhead | None:
    """What the middleware will summarize once this turn's tools answer, if that is certain now.

    The exact conditions are in the module docstring.
    """
    if turn.call_names and all(name in direct_tools for name in turn.call_names):
        return None  # the agent ends after these tools
    if not _predictable(middleware):
        return None
    known = turn.messages
    predicted: list[AnyMessage] = [*known, *(ToolMessage("", tool_call_id=i) for i in turn.call_ids)]
    tokens = middleware.token_counter(known) if grows_with_messages(middleware.token_counter) else 0
    if not middleware._should_summarize(predicted, tokens):
        return None
    cutoff = middleware._determine_cutoff_index(predicted)
    if not 0 < cutoff <= len(known):
        return None
    messages = known[:cutoff]
    if any(m.id is None for m in messages):
        return None
    return SummaryAhead(summary_key(messages), messages, create_summary_ahead(middleware))


def _predictable(middleware: SummarizationMiddleware) -> bool:
    """Whether the trigger and `keep` are of the kinds `summary_ahead` can predict."""
    clauses = getattr(middleware, "_trigger_clauses", None)
    if not isinstance(clauses, list) or not clauses:
        return False
    if not all(isinstance(c, Mapping) and c and set(c) <= TRIGGER_KINDS for c in clauses):
        return False
    keep = getattr(middleware, "keep", None)
    return isinstance(keep, tuple) and len(keep) == 2 and keep[0] == "messages"


def grows_with_messages(counter: Any) -> bool:
    """Whether appending ToolMessages can only raise `counter`'s count (see the module docstring).

    True only for LangChain's approximate counter with the keywords the middleware sets.
    """
    if counter is count_tokens_approximately:
        return True
    if not isinstance(counter, partial) or counter.func is not count_tokens_approximately or counter.args:
        return False
    keywords = counter.keywords
    if not set(keywords) <= {"use_usage_metadata_scaling", "chars_per_token"}:
        return False
    chars_per_token = keywords.get("chars_per_token", 4.0)
    return isinstance(chars_per_token, int | float) and chars_per_token > 0


def summary_key(messages: Sequence[BaseMessage]) -> str:
    """Identifies a summary's input: every field of every message (ids and contents)."""
    digest = hashlib.sha256()
    for message in messages:
        digest.update(repr((type(message).__name__, message.model_dump(warnings=False))).encode())
        digest.update(b"\x00")
    return digest.hexdigest()


def sync_speculation(middleware: SummarizationMiddleware) -> bool:
    """Whether a sync run may summarize ahead with `_acreate_summary` (a chat model writes summaries)."""
    return getattr(middleware, "summarizer", None) is None


# -- hooks -------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class _CreateSummary:
    """The middleware's `_create_summary`, asking the optimized run that runs it (if any)."""

    middleware: SummarizationMiddleware
    original: Callable[[list[AnyMessage]], str]
    route: Router

    def __call__(self, messages: list[AnyMessage]) -> str:
        run = self.route(self.middleware)
        return self.original(messages) if run is None else run.summary(messages, self.original)


@dataclass(frozen=True, eq=False)
class _ACreateSummary:
    """The middleware's `_acreate_summary`, asking the optimized run that runs it (if any)."""

    middleware: SummarizationMiddleware
    original: Callable[[list[AnyMessage]], Awaitable[str]]
    route: Router

    async def __call__(self, messages: list[AnyMessage]) -> str:
        run = self.route(self.middleware)
        return await self.original(messages) if run is None else await run.asummary(messages, self.original)


def install_hooks(middleware: SummarizationMiddleware, route: Router) -> None:
    """Wrap the middleware's summary creation (once): unchanged outside an optimized run.

    The wrappers are instance attributes, so the middleware's class and other instances
    are untouched; `before_model` looks them up on the instance as it does the methods.
    """
    if isinstance(vars(middleware).get("_acreate_summary"), _ACreateSummary):
        return
    middleware._create_summary = _CreateSummary(middleware, middleware._create_summary, route)  # type: ignore[method-assign]
    middleware._acreate_summary = _ACreateSummary(middleware, middleware._acreate_summary, route)  # type: ignore[method-assign]


def create_summary_ahead(middleware: SummarizationMiddleware) -> Callable[[list[AnyMessage]], Awaitable[str]]:
    """The middleware's own `_acreate_summary` (not the hook): what speculation runs."""
    hook = vars(middleware).get("_acreate_summary")
    return hook.original if isinstance(hook, _ACreateSummary) else middleware._acreate_summary


__all__ = [
    "SummaryAhead",
    "SummaryRoute",
    "ToolTurn",
    "create_summary_ahead",
    "find_summarization",
    "grows_with_messages",
    "install_hooks",
    "summary_ahead",
    "summary_key",
    "sync_speculation",
    "tool_turn",
]
