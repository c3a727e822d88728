"""Request and response bodies of the OpenAI-compatible endpoints (pydantic).

Requests forbid unknown fields, so a typo or an unsupported feature is a 400 naming the
field instead of being silently ignored. Sampling fields OpenAI clients commonly send
(temperature, top_p, max_tokens, stop, seed, user, ...) are accepted and ignored: the
app's own models carry their settings. `n` must be 1.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    """Fields OpenAI clients send that a served app ignores (its models have their own)."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    n: Literal[1] | None = None


class ChatCompletionRequest(_Sampling):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_completion_tokens: int | None = Field(default=None, ge=0)
    metadata: dict[str, str] | None = None
    store: bool | None = None


class CompletionRequest(_Sampling):
    model: str
    prompt: str | list[str] = Field(description="one prompt (a list must hold exactly one)")
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool | None = None
    suffix: str | None = None
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
