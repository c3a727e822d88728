"""One prefix warmer for a vLLM server, with one rule, used by every framework adapter.

    warmer = PrefixWarmer(make=lambda: VLLMHTTPEngine(url, model, retries=0))
    await warmer.start(WarmupPrompt(text="You are a careful assistant. Context: "))
    warmer.stats   # WarmupStats(warmups=1, warm_tokens=..., ...)

A framework adapter renders its prompt's ready start as the server tokenizes it (a
`WarmupPrompt`: completion text, or chat messages for the server's chat template); the
warmer tokenizes it on the server (`/tokenize`) and sends its whole KV blocks
(`VLLMHTTPEngine.warm`). The rule, the same for every adapter:

- A warm-up is an optimization: one that fails is logged and skipped, never raised.
- Give up on a server at once when it has no vLLM tokenizer (HTTP 404, 405 or 501), or
  after three warm-ups fail in a row (a success starts the count again); `stats.disabled`
  says why, and nothing more is sent.
- A prefix among the last `memo` (1,024) warm-ups, or on its way, is not sent again: the
  full request that followed it refreshed those blocks in the server's LRU.
- Made from a factory (`make`), the server's engine is made per event loop (an HTTP
  client's connections belong to the loop that opened them), and the first reads the
  server's KV block size from `/metrics` (16 if absent) for all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("teola_adapters.vllm_http")

UNSUPPORTED_STATUS = frozenset({404, 405, 501})  # no vLLM `/tokenize` here: never ask again
FAILURES_BEFORE_GIVING_UP = 3  # in a row


@dataclass
class WarmupStats:
    warmups: int = 0  # warm-up requests sent
    warm_tokens: int = 0  # prompt tokens they sent (whole blocks)
    repeats: int = 0  # prefixes not sent again (warmed recently)
    short: int = 0  # prefixes shorter than a block (nothing to send)
    failures: int = 0  # warm-ups that failed (the query went on without)
    disabled: str | None = None  # why this server is no longer warmed


@dataclass(frozen=True)
class WarmupPrompt:
    """One prefix as the server tokenizes it: completion `text`, or chat `messages`.

    Chat: the messages as the request sends them, the last left open when
    `continue_final_message`; `template` holds the request's other fields that change the
    chat template's rendering (`tools`, `chat_template_kwargs`).
    """

    text: str | None = None
    messages: tuple[Mapping[str, Any], ...] | None = None
    continue_final_message: bool = False
    template: tuple[tuple[str, Any], ...] = ()

    def key(self) -> str:
        """Equal for prefixes the server renders the same (what `memo` remembers)."""
        return json.dumps([self.messages, self.continue_final_message, self.template, self.text], default=str)

    async def tokenize(self, server: Any) -> list[int]:
        """Its token ids, from the server's `/tokenize` (`server`: a `VLLMHTTPEngine`)."""
        if self.messages is not None:
            return await server.tokenize_chat(
                self.messages, continue_final_message=self.continue_final_message, **dict(self.template)
            )
        if self.text is None:
            raise ValueError("a WarmupPrompt holds text or messages")
        return await server.tokenize(self.text)


class PrefixWarmer:
    """Warms a vLLM server's prefix cache with prompts' ready prefixes (the module's rule).

    server: a `VLLMHTTPEngine`, used as it is (its block size, retries and client).
    make: instead, a function that makes one: then one is made per event loop, and the
      first reads the server's block size.
    memo: how many recent warm-ups to remember.
    """

    def __init__(self, server: Any = None, *, make: Callable[[], Any] | None = None, memo: int = 1024) -> None:
        if (server is None) == (make is None):
            raise ValueError("give exactly one of: server (a VLLMHTTPEngine), make (a function that makes one)")
        self._given = server
        self._make = make
        self._per_loop: dict[asyncio.AbstractEventLoop, asyncio.Task[Any]] = {}
        self._block_size: int | None = None if server is None else server.block_size
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._memo = memo
        self._failures_in_a_row = 0
        self._sending: set[asyncio.Task[int]] = set()  # warm-ups on their way (kept from collection)
        # Sync and async queries of one optimized app run on different threads' loops.
        self._lock = threading.Lock()
        self.stats = WarmupStats()

    @property
    def stopped(self) -> bool:
        """Given up on this server (`stats.disabled` says why): nothing more is sent."""
        return self.stats.disabled is not None

    @property
    def block_size(self) -> int | None:
        """The server's KV block size the warm-ups use (None: no engine made yet)."""
        return self._block_size

    async def warm(self, prompt: WarmupPrompt | None) -> int:
        """Warm the server with `prompt` and wait for it: the tokens sent (0: nothing sent).

        Never raises: a warm-up is an optimization.
        """
        sending = await self.start(prompt)
        return 0 if sending is None else await sending

    async def start(self, prompt: WarmupPrompt | None) -> asyncio.Task[int] | None:
        """Tokenize `prompt` and send its warm-up; return once the request is on its way.

        The task ends with the tokens sent when the server has prefilled them (None: nothing
        to send). A full request sent next need not wait for that: it queues behind the
        warm-up and finds its blocks cached when the server admits it, whereas waiting for
        the warm-up's answer would put its last step and a round trip on the query's
        critical path. Never raises: a warm-up is an optimization.
        """
        if prompt is None or self.stopped:
            return None
        key = prompt.key()
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
            ids = await prompt.tokenize(server)
        except Exception as exc:
            self._failed(exc, key)
            return None
        sending = asyncio.get_running_loop().create_task(self._send(server, ids, key))
        self._sending.add(sending)
        sending.add_done_callback(self._sending.discard)
        await asyncio.sleep(0)  # the request goes out before the caller's own request can
        return sending

    async def aclose(self) -> None:
        """Close the engine made for the running loop (a given `server` is its owner's to close)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            task = self._per_loop.pop(loop, None)
        if task is not None:
            with contextlib.suppress(Exception):  # never made: nothing to close
                await (await task).close()

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
            if status in UNSUPPORTED_STATUS:
                self.stats.disabled = f"the server has no vLLM tokenizer endpoint (HTTP {status})"
            elif self._failures_in_a_row >= FAILURES_BEFORE_GIVING_UP:
                self.stats.disabled = f"{self._failures_in_a_row} warm-ups failed in a row, the last: {exc!r}"
            disabled = self.stats.disabled
        if disabled is not None:
            log.warning("teola: prefix warm-ups stop: %s (answers are unaffected)", disabled)
        else:
            log.info("teola: a prefix warm-up failed (the query goes on without it): %r", exc)
