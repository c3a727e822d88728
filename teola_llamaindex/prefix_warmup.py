"""A vLLM prefix warmer for `OpenAILike` / `OpenAI` completion clients (not a server).

    llm = OpenAILike(model="smollm2", api_base="http://127.0.0.1:8000/v1", api_key="x")
    fast = teola.optimize(index.as_query_engine(llm=llm))   # warms the prompt's ready prefix

The user's client still makes every LLM request; a split prefill's ready prefix is sent
ahead to the vLLM server (its `/tokenize`, whole KV blocks, `max_tokens=1`) so its prefix
cache holds it when the full request comes. The warming and when a failure stops it are
the shared `teola_adapters.vllm_http.PrefixWarmer`'s; when it warms: docs/llamaindex.md
("Prefix warm-up").
"""

from __future__ import annotations

import importlib
from typing import Any
from urllib.parse import urlparse

from llama_index.core.llms import LLM

from teola_adapters.server_load import ServerLoadWatch, root_of
from teola_adapters.vllm_http import PrefixWarmer, VLLMHTTPEngine, WarmupPrompt
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


def server_root(llm: Any) -> str | None:
    """The root URL of the OpenAI-compatible server an `OpenAILike` / `OpenAI` client talks
    to (`http://host:8000`), or None: another LLM class, or OpenAI's own API."""
    if openai_client_class(llm) is None:
        return None
    host = urlparse(str(llm.api_base or "")).hostname or ""
    return None if not host or host in _NO_WARMUP_HOSTS else root_of(str(llm.api_base))


def load_watch_for(llm: Any) -> ServerLoadWatch | None:
    """The load watch of an engine calling `llm` (`teola_adapters.server_load`): on a
    vLLM-like server its calls are held in Teola, earliest program first, once the server
    queues; on any other server, or another LLM, none (calls go at once)."""
    root = server_root(llm)
    return None if root is None else ServerLoadWatch(root)


def why_no_warmup(llm: Any) -> str | None:
    """Why a partial prefill cannot warm this LLM's server (see the module docstring), or None."""
    if openai_client_class(llm) is None:
        return f"{type(llm).__name__} is not OpenAILike or OpenAI"
    if llm.metadata.is_chat_model:
        return "a chat model (the server applies its chat template)"
    if server_root(llm) is None:
        return f"api_base {llm.api_base!r} is no OpenAI-compatible vLLM server"
    return None


class PrefixWarmingLLMEngine(LlamaIndexLLMEngine):
    """An `OpenAILike` / `OpenAI` client whose partial prefills warm its server (module docstring).

    warmer: the shared `PrefixWarmer` (its rule: when a failure stops the warm-ups).
    server: the server's root URL, for `explain()`.
    own_client: the warmer's engines made their own HTTP clients (`close` closes them).
    """

    def __init__(self, name: str, llm: LLM, warmer: PrefixWarmer, server: str, *, own_client: bool = True) -> None:
        super().__init__(name, llm)
        self.warmer = warmer
        self.server = server
        self._own_client = own_client

    @property
    def warmups(self) -> int:
        """Warm-up requests sent so far."""
        return self.warmer.stats.warmups

    @property
    def warm_error(self) -> str | None:
        """Why the warm-ups stopped (None: they go on)."""
        return self.warmer.stats.disabled

    async def run_call(self, call: Call) -> dict[str, Any]:
        if call.node.kind == PrimitiveKind.PARTIAL_PREFILL:
            prefix = call.inputs["prefix"]
            await self.warmer.warm(WarmupPrompt(text=prefix) if isinstance(prefix, str) and prefix else None)
            return {"kv": KVHandle(self.name, prefix)}
        return await super().run_call(call)

    async def close(self) -> None:
        if self._own_client:
            await self.warmer.aclose()


def warmup_notes(engines: Any) -> list[str]:
    """One line per LLM engine of an `EngineSet`: does it warm split prefixes, and where."""
    notes = []
    for name, engine in engines.engines.items():
        if isinstance(engine, PrefixWarmingLLMEngine):
            state = f"stopped ({engine.warm_error})" if engine.warm_error else f"{engine.warmups} sent"
            notes.append(f"{name}: warms split prefixes on {engine.server} ({state})")
        elif isinstance(engine, LlamaIndexLLMEngine):
            why = why_no_warmup(engine.llm)
            notes.append(f"{name}: no prefix warm-up ({why or 'warm_prefix=False'})")
    return notes


def llm_engine(name: str, llm: LLM, *, warm_prefix: bool = True) -> LlamaIndexLLMEngine:
    """The engine for `llm`: with prefix warm-up where `why_no_warmup` allows, else plain."""
    if not warm_prefix or why_no_warmup(llm) is not None:
        return LlamaIndexLLMEngine(name, llm)
    client = getattr(llm, "_async_http_client", None)

    def make() -> VLLMHTTPEngine:
        return VLLMHTTPEngine(
            str(llm.api_base),
            llm.model,
            name=name,
            api_key=llm.api_key or "EMPTY",
            timeout_s=float(llm.timeout or 60.0),
            retries=0,  # an optimization: a failed warm-up is skipped, not retried
            http_client=client,
        )

    warmer = PrefixWarmer(make=make)
    return PrefixWarmingLLMEngine(name, llm, warmer, root_of(str(llm.api_base)), own_client=client is None)
