"""From an OpenAI request to the app's input.

- chat: the text of the **last user message** (text parts joined); completions: the
  prompt (a list must hold exactly one prompt).
- The app's input schema decides the shape: an app that takes one value (a root
  schema: a chat model, a lambda) gets the text itself; an app that takes one variable
  (a prompt with `{question}`) gets `{"question": text}`; an app that takes several
  variables needs the text to be a JSON object, which is validated against the schema
  and passed on as sent. Errors name the request field and the app's variable.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError

from teola.server.errors import APIError, bad_request
from teola.server.schemas import ChatMessage


def chat_text(messages: list[ChatMessage]) -> tuple[str, str]:
    """The last user message's text, and its field path for errors."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            return messages[index].text(), f"messages.{index}.content"
    raise bad_request("messages: no message with role 'user'", param="messages")


def prompt_text(prompt: str | list[str]) -> tuple[str, str]:
    if isinstance(prompt, str):
        return prompt, "prompt"
    if len(prompt) != 1:
        raise bad_request(f"prompt: exactly one prompt per request, got {len(prompt)}", param="prompt")
    return prompt[0], "prompt.0"


def to_app_input(schema: type[BaseModel] | None, text: str, param: str, model: str) -> Any:
    """The app's input for `text` (see the module docstring); APIError 400 when it does not fit."""
    if schema is None or getattr(schema, "__pydantic_root_model__", False):
        return text
    fields = list(schema.model_fields)
    if not fields:
        return {}
    if len(fields) == 1:
        return {fields[0]: text}
    variables = ", ".join(fields)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _not_object(model, variables, param, f"not JSON ({exc.msg})") from exc
    if not isinstance(value, dict):
        raise _not_object(model, variables, param, f"a JSON {type(value).__name__}, not an object")
    try:
        schema.model_validate(value)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(object)'}: {e['msg']}" for e in exc.errors(include_url=False)
        )
        first = ".".join(str(p) for p in exc.errors(include_url=False)[0]["loc"])
        raise bad_request(
            f"{param}: input of model {model!r} is invalid: {problems}", param=f"{param}:{first}"
        ) from exc
    return value


def _not_object(model: str, variables: str, param: str, what: str) -> APIError:
    return bad_request(
        f"{param}: model {model!r} takes the variables {variables}; send them as a JSON object, got {what}",
        param=param,
    )
