"""LangChain prompts as Teola format primitives that know their ready prefixes.

A `ChatPromptTemplate` or `PromptTemplate` becomes a FORMAT node whose template is a
`LangChainPrompt`: a `teola_core.ir.prompt.PromptTemplate` (ordered literal and variable
segments) that also holds the user's prompt object.

- `render(values)` returns exactly what the prompt's `invoke` returns (a `PromptValue`):
  it validates the input as `BasePromptTemplate` does and calls `format_prompt`.
- `segments` list, message by message and in order, the literal text and the variables
  each message needs. For an f-string message (or string prompt) they are its parsed
  template; a message Teola cannot parse (mustache, jinja2, images, nested chat
  prompts) is *atomic*: its variables are listed, but a prefix never cuts inside it;
  a fixed message is one literal; a `MessagesPlaceholder` is one variable.
- `prefix(k).render(values)` renders the first k segments as a `PromptPrefix`: every
  message wholly inside the prefix, formatted by LangChain itself, then the start of
  the message cut at segment k (its role and its text so far). It is by construction
  the start of the full prompt: messages are never reordered, and the open message's
  text is the start of that message's content.

How a prefill split uses this: the prefill-split pass finds the longest run of leading
segments whose variables are ready early (say the system message and the question,
while retrieval still runs for `{context}`), adds a FORMAT node with
`prefix_segments=k` feeding a partial prefill, and the full prefill later computes only
the rest. An engine that can prefill a chat prefix renders `PromptPrefix.messages` with
its chat template and appends the open message *without* closing it (vLLM:
`continue_final_message=True, add_generation_prompt=False`), which is a token prefix of
the full conversation. An engine that cannot (a LangChain chat model called through its
API) treats the partial prefill as a no-op; results are the same either way.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.exceptions import ErrorCode, create_message
from langchain_core.messages import BaseMessage
from langchain_core.prompt_values import PromptValue
from langchain_core.prompts import (
    AIMessagePromptTemplate,
    BasePromptTemplate,
    ChatMessagePromptTemplate,
    ChatPromptTemplate,
    HumanMessagePromptTemplate,
    MessagesPlaceholder,
    PromptTemplate,
    SystemMessagePromptTemplate,
)

from teola_core.ir.prompt import PromptTemplate as TeolaTemplate
from teola_core.ir.prompt import Segment
from teola_langchain.components.classes import class_of
from teola_langchain.tracing.values import MISSING

PROMPT_TYPES: tuple[type[BasePromptTemplate[Any]], ...] = (ChatPromptTemplate, PromptTemplate)

_ROLES: dict[type, str] = {
    HumanMessagePromptTemplate: "human",
    AIMessagePromptTemplate: "ai",
    SystemMessagePromptTemplate: "system",
}


def is_prompt(step: object) -> bool:
    """Prompt classes whose rendering Teola reproduces exactly (exact class match)."""
    return class_of(step) in PROMPT_TYPES


@dataclass(frozen=True)
class NotAMapping:
    """The prompt's input was not a dict: rendering re-raises LangChain's own error."""

    value: Any


@dataclass(frozen=True)
class PromptPrefix:
    """The ready start of a prompt (see the module docstring).

    messages: whole messages, as LangChain formats them. open_role / open_text: the
    message cut short ("human", "ai", "system" or a ChatMessage role) and its content so
    far; for a string prompt open_role is None and open_text is the text so far.
    """

    messages: tuple[BaseMessage, ...] = ()
    open_role: str | None = None
    open_text: str = ""


@dataclass(frozen=True)
class _Message:
    """Where one message's segments sit and how to render it whole."""

    start: int
    stop: int
    atomic: bool
    role: str | None = None
    template: Any = None  # the message template, placeholder or fixed message


@dataclass(frozen=True, eq=False)
class LangChainPrompt(TeolaTemplate):
    """A FORMAT template that renders a LangChain prompt (see the module docstring)."""

    prompt: BasePromptTemplate[Any] = field(default=None, repr=False)  # type: ignore[assignment]
    messages: tuple[_Message, ...] = ()
    ports: tuple[str, ...] = ()
    chat: bool = True

    @property
    def variables(self) -> tuple[str, ...]:
        """Every key the prompt may read: template variables, optional and partial ones."""
        return self.ports

    def render(self, values: Mapping[str, Any]) -> PromptValue:
        return render_prompt(self.prompt, values)

    def prefix(self, k: int) -> TeolaTemplate:
        return LangChainPromptPrefix(self.segments[:k], source=self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LangChainPrompt) and other.prompt is self.prompt

    def __hash__(self) -> int:
        return id(self.prompt)


@dataclass(frozen=True, eq=False)
class LangChainPromptPrefix(TeolaTemplate):
    """The first segments of a `LangChainPrompt`; renders a `PromptPrefix`."""

    source: LangChainPrompt = field(default=None, repr=False)  # type: ignore[assignment]

    def prefix(self, k: int) -> TeolaTemplate:
        return LangChainPromptPrefix(self.segments[:k], source=self.source)

    def render(self, values: Mapping[str, Any]) -> PromptPrefix:
        return render_prefix(self.source, len(self.segments), values)


def render_prompt(prompt: BasePromptTemplate[Any], values: Mapping[str, Any]) -> PromptValue:
    """`prompt.invoke(input)` without a callback run; `values` hold MISSING for absent keys."""
    for value in values.values():
        if isinstance(value, NotAMapping):
            return prompt.invoke(value.value)  # raises LangChain's own TypeError
    inner = {k: v for k, v in values.items() if v is not MISSING}
    missing = set(prompt.input_variables).difference(inner)
    if missing:
        msg = (
            f"Input to {prompt.__class__.__name__} is missing variables {missing}. "
            f" Expected: {prompt.input_variables}"
            f" Received: {list(inner.keys())}"
        )
        example_key = missing.pop()
        msg += (
            f"\nNote: if you intended {{{example_key}}} to be part of the string"
            " and not a variable, please escape it with double curly braces like: "
            f"'{{{{{example_key}}}}}'."
        )
        raise KeyError(create_message(message=msg, error_code=ErrorCode.INVALID_PROMPT_INPUT))
    return prompt.format_prompt(**inner)


def prompt_input(value: Any, variables: tuple[str, ...], sole: str | None) -> dict[str, Any]:
    """Split a prompt's input into its variables, as `BasePromptTemplate` reads it.

    A non-dict input is the value of the sole input variable when there is exactly one
    (`sole`), otherwise an error LangChain reports when rendering.
    """
    if isinstance(value, dict):
        return {v: value.get(v, MISSING) for v in variables}
    if sole is not None:
        return {v: value if v == sole else MISSING for v in variables}
    marker = NotAMapping(value)
    return dict.fromkeys(variables, marker)


def sole_variable(prompt: BasePromptTemplate[Any]) -> str | None:
    return prompt.input_variables[0] if len(prompt.input_variables) == 1 else None


# -- building the segment view ---------------------------------------------------------
def describe(prompt: BasePromptTemplate[Any]) -> LangChainPrompt:
    """The FORMAT template of a recognised prompt."""
    segments: list[Segment] = []
    messages: list[_Message] = []
    if isinstance(prompt, ChatPromptTemplate):
        for m in prompt.messages:
            start = len(segments)
            parsed = _f_string_segments(getattr(m, "prompt", None))
            if isinstance(m, BaseMessage):
                segments.append(Segment(text=m.text))
                messages.append(_Message(start, len(segments), True, None, m))
            elif isinstance(m, MessagesPlaceholder):
                segments.append(Segment(var=m.variable_name))
                messages.append(_Message(start, len(segments), True, None, m))
            elif parsed is not None and _role(m) is not None and not _has_own_partials(m):
                segments.extend(parsed)
                messages.append(_Message(start, len(segments), False, _role(m), m))
            else:
                names = list(getattr(m, "input_variables", []))
                segments.extend(Segment(var=v) for v in names)
                if not names:
                    segments.append(Segment(text=""))
                messages.append(_Message(start, len(segments), True, _role(m), m))
        chat = True
    else:
        parsed = _f_string_segments(prompt)
        atomic = parsed is None
        segments.extend(parsed if parsed is not None else [Segment(var=v) for v in prompt.input_variables])
        messages.append(_Message(0, len(segments), atomic, None, prompt))
        chat = False
    ports: dict[str, None] = {}
    for seg in segments:
        if seg.var is not None:
            ports.setdefault(seg.var, None)
    for name in (*prompt.input_variables, *prompt.optional_variables, *prompt.partial_variables):
        ports.setdefault(name, None)
    return LangChainPrompt(tuple(segments), prompt=prompt, messages=tuple(messages), ports=tuple(ports), chat=chat)


def _role(message_template: Any) -> str | None:
    if class_of(message_template) is ChatMessagePromptTemplate:
        return message_template.role
    return _ROLES.get(class_of(message_template))


def _has_own_partials(message_template: Any) -> bool:
    inner = getattr(message_template, "prompt", None)
    return bool(getattr(inner, "partial_variables", None))


def _f_string_segments(template: Any) -> list[Segment] | None:
    """Segments of an f-string `PromptTemplate`, or None when it is anything else."""
    if class_of(template) is not PromptTemplate or template.template_format != "f-string":
        return None
    segments: list[Segment] = []
    try:
        for literal, name, spec, conversion in string.Formatter().parse(template.template):
            if literal:
                segments.append(Segment(text=literal))
            if name is not None:
                if not name.isidentifier() or spec or conversion:
                    return None
                segments.append(Segment(var=name))
    except ValueError:
        return None
    return segments


# -- rendering a prefix ----------------------------------------------------------------
def render_prefix(source: LangChainPrompt, k: int, values: Mapping[str, Any]) -> PromptPrefix:
    """Whole messages within the first k segments, then the start of the one cut at k."""
    prompt = source.prompt
    partials = {n: v() if callable(v) else v for n, v in prompt.partial_variables.items()}
    given = {n: v for n, v in values.items() if v is not MISSING and not isinstance(v, NotAMapping)}
    merged = {**partials, **given}
    if not source.chat:
        (message,) = source.messages
        if message.atomic and k < message.stop:
            return PromptPrefix()
        return PromptPrefix(open_text=_segments_text(source.segments[:k], merged))
    done: list[BaseMessage] = []
    for m in source.messages:
        if m.stop <= k:
            done.extend(_format_message(m, merged))
            continue
        if m.start < k and not m.atomic:
            return PromptPrefix(tuple(done), m.role, _segments_text(source.segments[m.start : k], merged))
        break
    return PromptPrefix(tuple(done))


def _format_message(m: _Message, values: Mapping[str, Any]) -> list[BaseMessage]:
    if isinstance(m.template, BaseMessage):
        return [m.template]
    return list(m.template.format_messages(**values))


def _segments_text(segments: tuple[Segment, ...], values: Mapping[str, Any]) -> str:
    return "".join(seg.text if seg.var is None else format(values[seg.var], "") for seg in segments)


def render_whole(prompt: BasePromptTemplate[Any]) -> Any:
    """Render a prompt without variables from its whole input (checked as LangChain does)."""

    def render(value: Any) -> PromptValue:
        if not isinstance(value, dict) and sole_variable(prompt) is None:
            return prompt.invoke(value)  # raises LangChain's own TypeError
        return render_prompt(prompt, {})

    return render


def split_input(variables: tuple[str, ...], sole: str | None) -> Any:
    """A multi-output call function: the prompt's input, one port per variable."""

    def split(value: Any) -> dict[str, Any]:
        return prompt_input(value, variables, sole)

    def single(value: Any) -> Any:
        return prompt_input(value, variables, sole)[variables[0]]

    # a call node with one output port returns the value itself, not a mapping
    return single if len(variables) == 1 else split
