"""`OpenAILike` / `OpenAI` clients on Teola's LLM engine path, with prefix warm-up.

    llm = OpenAILike(model="smollm2", api_base="http://127.0.0.1:8000/v1", api_key="x")
    fast = teola.optimize(index.as_query_engine(llm=llm), profiles=...)

The LLM call stays the user's object (`acomplete(prompt, formatted=True)` / `achat`), so
every output is LlamaIndex's own: same request, same client, same retries. What Teola
adds is the partial prefill of a split prompt (see `teola_core.passes.prefill_split`):
on an OpenAI-compatible vLLM server, `PARTIAL_PREFILL` sends the ready prefix to the
server through Teola's `VLLMHTTPEngine` (tokenized by the server's `/tokenize`, whole KV
blocks as token ids, a `max_tokens=1` completion), so the server's automatic prefix
cache holds those blocks when the full request comes. The full prefill and the decode
are the client's one request, as before.

When it warms: the exact classes `OpenAILike` (llama-index-llms-openai-like) and `OpenAI`
(llama-index-llms-openai) as completion models (`metadata.is_chat_model` False: their
`acomplete` sends the prompt text to `/v1/completions`, which is what the warm-up's token
ids are a prefix of); never for a chat model (the server would apply its chat template
around the text: the token ids would not be a prefix) nor for OpenAI's own API (no
`/tokenize`; it caches prompts itself). The warm-up takes the client's `api_base`,
`model`, `api_key`, `timeout` and async HTTP client, and the server's KV block size from
its `/metrics` (16 if it has none).

A warm-up is an optimization only: if it fails (no `/tokenize`, a timeout, ...) the
query goes on unchanged, the engine records why (`warm_error`) and sends no more
warm-ups. `warm_prefix=False` (an option of every optimized object) turns it off.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any
from urllib.parse import urlparse

from llama_index.core.llms import LLM

from teola_core.engines.protocol import Call
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.types import KVHandle
from teola_llamaindex.engines import LlamaIndexLLMEngine

_CLIENTS = (("llama_index.llms.openai_like", "OpenAILike"), ("llama_index.llms.openai", "OpenAI"))
_NO_WARMUP_HOSTS = frozenset({"api.openai.com"})


def openai_client_class(llm: Any) -> type | None:
    """`OpenAILike` or `OpenAI` when `llm` is exactly one of them (imported only if it may be)."""
    cls = type(llm)
    if not cls.__module__.startswith("llama_index.llms.openai"):
        return None
    for module, name in _CLIENTS:
        try:
            candidate = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        if cls is candidate:
            return candidate
    return None


def why_no_warmup(llm: Any) -> str | None:
    """Why a partial prefill cannot warm this LLM's server (see the module docstring), or None."""
    if openai_client_class(llm) is None:
        return f"{type(llm).__name__} is not OpenAILike or OpenAI"
    if llm.metadata.is_chat_model:
        return "a chat model (the server applies its chat template)"
    host = urlparse(str(llm.api_base or "")).hostname or ""
    if not host or host in _NO_WARMUP_HOSTS:
        return f"api_base {llm.api_base!r} is no OpenAI-compatible vLLM server"
    return None


class OpenAICompatibleLLMEngine(LlamaIndexLLMEngine):
    """An `OpenAILike` / `OpenAI` client whose partial prefills warm its server (module docstring)."""

    def __init__(self, name: str, llm: LLM, warmer: Any) -> None:
        super().__init__(name, llm)
        self.warmer = warmer
        self.warm_error: str | None = None
        self._own_client = getattr(llm, "_async_http_client", None) is None
        self._block_size_known = False

    @property
    def warmups(self) -> int:
        """Warm-up requests sent so far."""
        return self.warmer.stats.warmups

    async def run_call(self, call: Call) -> dict[str, Any]:
        if call.node.kind == PrimitiveKind.PARTIAL_PREFILL:
            await self._warm(call)
            return {"kv": KVHandle(self.name, call.inputs["prefix"])}
        return await super().run_call(call)

    async def _warm(self, call: Call) -> None:
        if self.warm_error is not None:
            return
        try:
            if not self._block_size_known:
                self._block_size_known = True
                with contextlib.suppress(Exception):  # no /metrics: keep the default block size
                    await self.warmer.use_server_block_size()
            await self.warmer.run_one(call)
        except Exception as exc:  # an optimization only: the query goes on
            self.warm_error = f"{type(exc).__name__}: {exc}"

    async def close(self) -> None:
        if self._own_client:
            await self.warmer.close()


def warmup_notes(engines: Any) -> list[str]:
    """One line per LLM engine of an `EngineSet`: does it warm split prefixes, and where."""
    notes = []
    for name, engine in engines.engines.items():
        if isinstance(engine, OpenAICompatibleLLMEngine):
            state = f"stopped ({engine.warm_error})" if engine.warm_error else f"{engine.warmups} sent"
            notes.append(f"{name}: warms split prefixes on {engine.warmer.base_url} ({state})")
        elif isinstance(engine, LlamaIndexLLMEngine):
            why = why_no_warmup(engine.llm)
            notes.append(f"{name}: no prefix warm-up ({why or 'warm_prefix=False'})")
    return notes


def llm_engine(name: str, llm: LLM, *, warm_prefix: bool = True) -> LlamaIndexLLMEngine:
    """The engine for `llm`: with prefix warm-up where `why_no_warmup` allows, else plain."""
    if not warm_prefix or why_no_warmup(llm) is not None:
        return LlamaIndexLLMEngine(name, llm)
    from teola_adapters.vllm_http.engine import VLLMHTTPEngine

    warmer = VLLMHTTPEngine(
        str(llm.api_base),
        llm.model,
        name=name,
        api_key=llm.api_key or "EMPTY",
        timeout_s=float(llm.timeout or 60.0),
        retries=0,
        http_client=getattr(llm, "_async_http_client", None),
    )
    return OpenAICompatibleLLMEngine(name, llm, warmer)
