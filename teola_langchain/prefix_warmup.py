"""Real prefix prefill for LangChain models on a vLLM server: what is LangChain's of it.

    warmer = warmer_for(model)                                   # a langchain-openai model's server
    await warmer.start(render(model, runnable, prompt_prefix))   # sent, not waited for

A `ChatOpenAI` or `OpenAI` (langchain-openai) with a `base_url` talks to an
OpenAI-compatible server (`openai_compatible`). When that server is vLLM, the prefill
split Teola plans for the model becomes real: a PARTIAL_PREFILL renders the ready start
of the prompt exactly as the model will send it (`render`), and the shared
`teola_adapters.vllm_http.PrefixWarmer` tokenizes it on the server and sends its whole KV
blocks; when the model's own request arrives, vLLM finds them in its prefix cache. The
warmer's rule (failures, give-up, memo, per-loop engines) is its module docstring's.

- Chat models: the prefix's messages go through the model's own request builder
  (`_get_request_payload`, so roles and content are what the model sends) and the
  server's chat template (`/tokenize` with `messages`): whole messages closed, the
  message cut short left open (`continue_final_message=True`), no generation prompt —
  a token prefix of the full conversation. Bound `tools` and `chat_template_kwargs`
  go along, as they change the rendering.
- Completion models: the prefix's text (a chat prompt's text is LangChain's
  `get_buffer_string`, as `ChatPromptValue.to_string`), tokenized as a prompt.

What it never changes is the model's call: decode still calls the model (`ainvoke`,
`astream`), so the answer is LangChain's own. The warm-up request goes once it is sent,
not answered (`PrefixWarmer.start`).

Why only partial prefills warm: a whole-prompt PREFILL is followed at once by its decode,
which is one request that prefills the prompt itself; warming first would put a round
trip and a server step on the query's critical path and reuse nothing.
"""

from __future__ import annotations

import logging
import sys
from typing import Any
from urllib.parse import urlparse

from langchain_core.language_models import BaseChatModel, BaseLanguageModel
from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, HumanMessage, SystemMessage, get_buffer_string

from teola_adapters.server_load import root_of
from teola_adapters.vllm_http import PrefixWarmer, VLLMHTTPEngine, WarmupPrompt
from teola_langchain.components.models import is_binding
from teola_langchain.components.prompts import PromptPrefix

log = logging.getLogger("teola.langchain")

_OPEN_MESSAGE: dict[str, type[BaseMessage]] = {"human": HumanMessage, "ai": AIMessage, "system": SystemMessage}


def openai_compatible(model: BaseLanguageModel[Any]) -> bool:
    """A langchain-openai `ChatOpenAI`/`OpenAI` sending to a server of your own (`base_url` set)."""
    module = sys.modules.get("langchain_openai")  # a model of its classes exists only if it was imported
    if module is None or not isinstance(model, (module.ChatOpenAI, module.OpenAI)):
        return False
    base = getattr(model, "openai_api_base", None)
    return bool(base) and urlparse(str(base)).hostname != "api.openai.com"


def server_root(model: BaseLanguageModel[Any]) -> str | None:
    """The root URL of the server a langchain-openai model talks to (`openai_compatible`), or None."""
    return root_of(str(model.openai_api_base)) if openai_compatible(model) else None  # type: ignore[attr-defined]


def warmer_for(model: BaseLanguageModel[Any]) -> PrefixWarmer:
    """A warmer for the server a langchain-openai model talks to (`openai_compatible`)."""

    def make() -> VLLMHTTPEngine:
        key = getattr(model, "openai_api_key", None)
        return VLLMHTTPEngine(
            str(model.openai_api_base),  # type: ignore[attr-defined]
            str(model.model_name),  # type: ignore[attr-defined]
            name=f"warm-up:{type(model).__name__}",
            api_key=key.get_secret_value() if key is not None else "EMPTY",
            retries=0,  # an optimization: a failed warm-up is skipped, not retried
            timeout_s=30.0,
            default_headers=getattr(model, "default_headers", None),
        )

    return PrefixWarmer(make=make)


def render(model: BaseLanguageModel[Any], runnable: Any, prefix: Any) -> WarmupPrompt | None:
    """How the server tokenizes `prefix` as `runnable` (the model or a binding of it) sends it.

    None: nothing to warm (not a `PromptPrefix`, empty, or the model's request builder refused).
    """
    if not isinstance(prefix, PromptPrefix):
        return None
    try:
        return _render(model, runnable, prefix)
    except Exception as exc:  # the model's request builder refused: nothing to warm
        log.debug("teola: no warm-up for %s: %s", type(model).__name__, exc)
        return None


def _render(model: BaseLanguageModel[Any], runnable: Any, prefix: PromptPrefix) -> WarmupPrompt | None:
    messages = list(prefix.messages)
    open_role = prefix.open_role
    if not messages and open_role is None:  # a string prompt: a chat model reads it as one human message
        if not prefix.open_text:
            return None
        open_role = "human"
    if open_role is not None:
        messages.append(_open_message(open_role, prefix.open_text))
    if not isinstance(model, BaseChatModel):
        text = prefix.open_text if not prefix.messages and prefix.open_role is None else get_buffer_string(messages)
        return WarmupPrompt(text=text) if text else None
    kwargs = dict(runnable.kwargs) if is_binding(runnable) else {}
    payload = model._get_request_payload(messages, **kwargs)  # type: ignore[attr-defined]
    sent = payload.get("messages")
    if not isinstance(sent, list) or not sent:  # e.g. the Responses API: no chat template to mirror
        return None
    template = {"tools": payload.get("tools")}
    extra = payload.get("extra_body") or {}
    template["chat_template_kwargs"] = payload.get("chat_template_kwargs") or extra.get("chat_template_kwargs")
    return WarmupPrompt(
        messages=tuple(sent),
        continue_final_message=open_role is not None,
        template=tuple((k, v) for k, v in template.items() if v is not None),
    )


def _open_message(role: str, text: str) -> BaseMessage:
    make = _OPEN_MESSAGE.get(role)
    return make(content=text) if make is not None else ChatMessage(role=role, content=text)
