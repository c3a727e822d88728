"""The engines behind the simulated servers' endpoints, and vLLM's token ids for them.

    backend = SimBackend(time_scale=0.5, batching="dynamic", responder=ExampleResponder())
    text = await backend.generate(prompt, max_tokens=64)     # on the simulated 7B LLM
    vectors = await backend.embed_batches.submit(texts, len(texts))

`max_num_seqs` (vLLM's option of that name): at most that many LLM requests run at once;
the others wait, first come first served, or by request `priority` with
`scheduling_policy="priority"` (`slots.RequestSlots`; None: every request runs at once, as
when the KV cache holds them all). `kv_cache_tokens`: the LLM's KV cache is a pool of that
many tokens shared by the running requests and the prefix cache, as vLLM's
(`num_gpu_blocks` x block size): a prompt waits for room, and prefixes evicted under
pressure are computed again (`llm.stats.recomputed_tokens`); None: a prefix cache of the
paper's LLM's size beside unbounded running requests. `llm_profile`: the LLM's step costs
(the paper's 7B by default). `chat_script`: which tools a chat request calls
(`ChatScript`; None: every answer is text).

It lives on the server's event loop: one `SimLLM` (continuous batching, prefix cache),
one `SimEmbedder` and one reranker instance with the paper's profiles, shared by every
client of the server, so systems run against one server are compared fairly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from teola_adapters.simulated.clock import SimClock
from teola_adapters.simulated.embedding import SimEmbedder
from teola_adapters.simulated.llm import SimLLM
from teola_adapters.simulated.paper_profiles import EMBEDDER, LLM, LLM_CACHE_TOKENS, RERANKER
from teola_adapters.simulated.prefix_cache import PrefixCache
from teola_adapters.simulated.reranker import relevance
from teola_adapters.simulated.servers.batcher import Batcher, Batching
from teola_adapters.simulated.servers.slots import RequestSlots, SchedulingPolicy
from teola_adapters.simulated.text import tokens_of
from teola_core.engines.protocol import Call
from teola_core.ir.kinds import Capabilities, PortSpec, PrimitiveKind
from teola_core.ir.node import Node, kind_node
from teola_core.ir.types import PortType
from teola_core.profiles.profile import LatencyProfile

ChatScript = Callable[[Sequence[dict[str, Any]]], "list[ScriptedToolCall] | None"]
"""Given a chat request's messages, the tool calls the model makes (None: it answers in text)."""


@dataclass(frozen=True)
class ScriptedToolCall:
    """A tool call a scripted chat answer carries beside its text (OpenAI's `tool_calls` item)."""

    name: str
    arguments: dict[str, Any]


def _llm_node(kind: PrimitiveKind, max_tokens: int = 0) -> Node:
    if kind == PrimitiveKind.DECODE:
        return Node(
            "decode",
            kind,
            (PortSpec("kv", PortType.KV),),
            (PortSpec("text", PortType.TEXT),),
            engine="llm",
            config={"max_tokens": max_tokens},
            caps=Capabilities(batchable=True),
        )
    return kind_node(kind.value, kind, "llm")


class SimBackend:
    """The engines behind the HTTP endpoints (see the module docstring)."""

    def __init__(
        self,
        time_scale: float,
        batching: Batching,
        responder: Callable[[str, int], str],
        max_batch_items: int | None = None,
        max_num_seqs: int | None = None,
        scheduling_policy: SchedulingPolicy = "fcfs",
        *,
        llm_profile: LatencyProfile = LLM,
        kv_cache_tokens: int | None = None,
        chat_script: ChatScript | None = None,
    ) -> None:
        self.kv_cache_tokens = kv_cache_tokens
        self.llm = SimLLM(
            llm_profile,
            time_scale=time_scale,
            responder=responder,
            cache_tokens=kv_cache_tokens or LLM_CACHE_TOKENS,
            kv_pool=kv_cache_tokens is not None,
        )
        self.chat_script = chat_script
        self.llm_slots = RequestSlots(max_num_seqs, scheduling_policy)
        self.embedder = SimEmbedder(EMBEDDER, time_scale=time_scale)
        self.rerank_clock = SimClock(time_scale)
        embed_max = max_batch_items or EMBEDDER.max_efficient_batch("embed")
        rerank_max = max_batch_items or RERANKER.max_efficient_batch("rerank")
        self.embed_batches = Batcher(self._embed_batch, batching, embed_max)
        self.rerank_batches = Batcher(self._rerank_batch, batching, rerank_max)
        # requests by endpoint, and LLM requests that carried vLLM's `priority` field
        self.requests = {"chat": 0, "completions": 0, "embeddings": 0, "rerank": 0, "tokenize": 0, "with_priority": 0}
        self.embed_batch_sizes: list[int] = []
        self._vocabulary: dict[str, int] = {}
        self._words: list[str] = []

    # -- the tokenizer (vLLM's /tokenize and token-id prompts) ---------------------------
    def token_ids(self, text: str) -> list[int]:
        """The simulated tokenizer's ids for `text`: its words, numbered in order of first sight."""
        ids = []
        for word in tokens_of(text):
            if word not in self._vocabulary:
                self._vocabulary[word] = len(self._words)
                self._words.append(word)
            ids.append(self._vocabulary[word])
        return ids

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of token ids: their words, space-separated (the same tokens again)."""
        if not all(isinstance(i, int) and 0 <= i < len(self._words) for i in ids):
            raise ValueError("unknown token id")
        return " ".join(self._words[i] for i in ids)

    # -- LLM ---------------------------------------------------------------------------
    async def _kv(self, prompt: str) -> Any:
        return (await self.llm.run_one(Call("http", _llm_node(PrimitiveKind.PREFILL), {"prompt": prompt})))["kv"]

    def check_fits(self, prompt: str) -> None:
        """A prompt longer than the KV pool is refused up front (ValueError), as vLLM refuses
        one beyond the model's context."""
        if self.kv_cache_tokens is not None and len(tokens_of(prompt)) > self.kv_cache_tokens:
            raise ValueError(
                f"the prompt's {len(tokens_of(prompt))} tokens exceed the KV cache ({self.kv_cache_tokens} tokens)"
            )

    async def generate(self, prompt: str, max_tokens: int, priority: int = 0) -> str:
        async with self.llm_slots.running(priority):
            kv = await self._kv(prompt)
            out = await self.llm.run_one(Call("http", _llm_node(PrimitiveKind.DECODE, max_tokens), {"kv": kv}))
        return str(out["text"])

    async def stream(self, prompt: str, max_tokens: int, priority: int = 0) -> AsyncIterator[str]:
        async with self.llm_slots.running(priority):
            kv = await self._kv(prompt)
            async for piece in self.llm.stream(Call("http", _llm_node(PrimitiveKind.DECODE, max_tokens), {"kv": kv})):
                yield piece

    def reset_prefix_cache(self) -> None:
        """Empty the LLM's prefix cache (between benchmark runs)."""
        if self.llm.cache is not None:
            self.llm.cache = PrefixCache(self.kv_cache_tokens or LLM_CACHE_TOKENS)

    # -- embeddings and rerank ---------------------------------------------------------
    async def _embed_batch(self, requests: list[list[str]]) -> list[list[list[float]]]:
        items = sum(len(r) for r in requests)
        self.embed_batch_sizes.append(items)
        async with self.embedder.clock.slot():
            await self.embedder.clock.spend(self.embedder.profile.latency("embed", items))
        return [[self.embedder.embed(t) for t in texts] for texts in requests]

    async def _rerank_batch(self, requests: list[tuple[str, list[str]]]) -> list[list[float]]:
        items = sum(len(docs) for _, docs in requests)
        async with self.rerank_clock.slot():
            await self.rerank_clock.spend(RERANKER.latency("rerank", items))
        return [[relevance(q, d) for d in docs] for q, docs in requests]

    async def close(self) -> None:
        await self.embed_batches.close()
        await self.rerank_batches.close()
        await self.llm.close()
