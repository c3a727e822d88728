"""Request and response bodies of the OpenAI-compatible endpoints (pydantic).

Requests are strict: types are not coerced (`"stream": "yes"` is a 400), unknown fields
are a 400 naming the field, and so is every OpenAI field a served app cannot honour
(`temperature`, `max_tokens`, ...: the app's own models carry their settings), unless it
is null. Honoured: `model`, `messages` / `prompt` (see `inputs`), `stream`,
`stream_options.include_usage`, `stop` (the answer is cut before the first stop string),
`echo` (completions: the prompt comes first), `n` and `best_of` (1 only), `store`
(false only).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

_SAMPLING = "sampling is set by the served app's own models"
_LENGTH = "output length is set by the served app's own models"
# OpenAI request fields a served app cannot honour, and why (refused unless null).
UNSUPPORTED: dict[str, str] = {
    "temperature": _SAMPLING,
    "top_p": _SAMPLING,
    "presence_penalty": _SAMPLING,
    "frequency_penalty": _SAMPLING,
    "logit_bias": _SAMPLING,
    "seed": _SAMPLING,
    "logprobs": "the served app's answer carries no log-probabilities",
    "top_logprobs": "the served app's answer carries no log-probabilities",
    "max_tokens": _LENGTH,
    "max_completion_tokens": _LENGTH,
    "user": "Teola does not record end users",
    "metadata": "Teola does not store completions",
    "suffix": "the served app writes no suffix",
    "tools": "the served app's tools are its own",
    "tool_choice": "the served app's tools are its own",
    "parallel_tool_calls": "the served app's tools are its own",
    "functions": "the served app's tools are its own",
    "function_call": "the served app's tools are its own",
    "response_format": "the served app decides its answer's format",
    "reasoning_effort": _SAMPLING,
    "service_tier": "Teola has no service tiers",
    "modalities": "the served app answers in text",
    "audio": "the served app answers in text",
    "prediction": "the served app's models take no predicted output",
    "web_search_options": "the served app's tools are its own",
}
_MESSAGE_UNSUPPORTED = {
    "name": "the served app gets the message text only",
    "tool_call_id": "the served app gets the message text only",
}


def refuse_unsupported(value: Any, info: ValidationInfo) -> Any:
    if value is not None:
        raise PydanticCustomError(
            "unsupported",
            "not supported by a served Teola app ({why}); leave it out",
            {"why": {**UNSUPPORTED, **_MESSAGE_UNSUPPORTED}[info.field_name or ""]},
        )
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None
    name: Any = None  # refused unless null: the app sees only the text
    tool_call_id: Any = None

    _refuse = field_validator(*_MESSAGE_UNSUPPORTED)(refuse_unsupported)

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Request(_Strict):
    """What both endpoints take."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(default=None, description="cut the answer before the first of these")
    n: Literal[1] | None = None
    store: Literal[False] | None = None
    temperature: Any = None
    top_p: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    logit_bias: Any = None
    seed: Any = None
    logprobs: Any = None
    top_logprobs: Any = None
    max_tokens: Any = None
    max_completion_tokens: Any = None
    user: Any = None
    metadata: Any = None
    suffix: Any = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None
    reasoning_effort: Any = None
    service_tier: Any = None
    modalities: Any = None
    audio: Any = None
    prediction: Any = None
    web_search_options: Any = None

    _refuse = field_validator(*UNSUPPORTED)(refuse_unsupported)

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [s for s in ([self.stop] if isinstance(self.stop, str) else self.stop) if s]


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)


class CompletionRequest(_Request):
    prompt: str | list[str] = Field(description="one prompt (a list must hold exactly one)")
    echo: bool | None = None
    best_of: Literal[1] | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop"] = "stop"
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: Literal["stop"] = "stop"
    logprobs: None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "teola"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody

    @classmethod
    def of(cls, message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
        return cls(error=ErrorBody(message=message, type=type, param=param, code=code)).model_dump()
