"""The engines behind a workflow's proxies: each runs the call the step made on the wrapped
object (an LLM call, a retrieval) or batches the steps' embedding requests into one.

A call's request travels through its graph as a value: an `LLMThunk` (the step's own LLM
call, awaited by the engine) or an `EmbedRequest`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding

from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits, LoadWatch, PerCallEngine
from teola_core.ir.kinds import PrimitiveKind


@dataclass(frozen=True)
class LLMThunk:
    """One LLM call, as the step made it (the engine awaits it)."""

    run: Callable[[], Awaitable[Any]]


@dataclass(frozen=True)
class EmbedRequest:
    """One embedding call: "query" (one text), "text" (a batch) or "agg" (a retriever's query)."""

    mode: str
    texts: tuple[str, ...]


class WorkflowLLMEngine(PerCallEngine):
    """A workflow's LLM: each DECODE call awaits the step's own call on the wrapped LLM.

    load_watch: for an LLM on a vLLM-like server (`prefix_warmup.load_watch_for`), the
    calls in flight follow what the server runs at once, the rest wait here, earliest
    run first.
    """

    kinds = frozenset({PrimitiveKind.DECODE})
    limits = EngineLimits(concurrency=64, max_batch_items=1)  # a batch is one request to the model
    driver_only = True  # it awaits the step's own call

    def __init__(self, name: str, load_watch: LoadWatch | None = None) -> None:
        self.name = name
        self.load_watch = load_watch

    async def run_call(self, call: Call) -> dict[str, Any]:
        return {"text": await call.inputs["kv"].run()}


class WorkflowEmbeddingEngine(Engine):
    """A workflow's embed model; the text batches of one engine batch go out as one request.

    One batch at a time (like one model instance): calls issued while a batch runs
    queue, and the next batch takes them together, whichever run issued them.
    """

    kinds = frozenset({PrimitiveKind.EMBED})
    limits = EngineLimits(concurrency=1)
    driver_only = True  # the embed model's events and spans belong to the caller's trace

    def __init__(self, name: str, embed_model: BaseEmbedding) -> None:
        self.name = name
        self.embed_model = embed_model

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        requests: list[EmbedRequest] = [c.inputs["texts"] for c in calls]
        texts = [t for r in requests if r.mode == "text" for t in r.texts]
        singles = [self._one(r) for r in requests if r.mode != "text"]
        merged, *results = await asyncio.gather(self._texts(texts), *singles, return_exceptions=True)
        others = iter(results)
        out: list[CallResult] = []
        offset = 0
        for request in requests:
            if request.mode != "text":
                out.append(next(others))
            elif isinstance(merged, BaseException):  # the merged request failed: its calls fail
                out.append(merged)
            else:
                n = len(request.texts)
                out.append({"vectors": merged[offset : offset + n]})
                offset += n
        return out

    async def _texts(self, texts: list[str]) -> list[Any]:
        """The text calls' embeddings, in requests of at most the model's `embed_batch_size`."""
        size = max(1, self.embed_model.embed_batch_size)
        chunks = [texts[i : i + size] for i in range(0, len(texts), size)]
        vectors = await asyncio.gather(*(self.embed_model._aget_text_embeddings(c) for c in chunks))
        return [v for chunk in vectors for v in chunk]

    async def _one(self, request: EmbedRequest) -> dict[str, Any]:
        if request.mode == "query":
            (text,) = request.texts
            return {"vectors": [await self.embed_model._aget_query_embedding(text)]}
        return {"vectors": [await self.embed_model.aget_agg_embedding_from_queries(list(request.texts))]}


class WorkflowRetrieverEngine(PerCallEngine):
    """A retriever as one SEARCH: `aretrieve(bundle)` as the step would call it."""

    kinds = frozenset({PrimitiveKind.SEARCH})
    limits = EngineLimits(concurrency=16)
    driver_only = True  # calls the app's retriever in the step's context

    def __init__(self, name: str, retriever: BaseRetriever) -> None:
        self.name = name
        self.retriever = retriever

    async def run_call(self, call: Call) -> dict[str, Any]:
        return {"hits": [await self.retriever.aretrieve(bundle) for bundle in call.inputs["index"]]}
