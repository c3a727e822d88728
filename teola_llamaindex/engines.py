"""The user's own LlamaIndex components as Teola engines, one engine per component object.

    engine = LlamaIndexLLMEngine("llm:MockLLM", llm)              # decode: llm.complete / acomplete
    engine = LlamaIndexRetrieverEngine("retriever:X", retriever)  # SEARCH: retriever.retrieve / aretrieve

`registry.EngineRegistry` makes one per component object, so every query that uses a
component shares its engine and their calls meet in one engine scheduler. An engine
calls the component's own public method, sync or async as the query was called, in the
query's context (`scope`, given with each call: `Call.context`), so the framework's
spans, events and callbacks are its own. That context (the caller's contextvars and
thread) cannot leave the driver process, so these engines are `driver_only`: on the Ray
backend they run in the driver, and engines chosen with `engines=` run in actors.
What each engine calls, and why they take one call per batch: docs/llamaindex.md
("Engines").
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.llms import LLM
from llama_index.core.schema import QueryBundle

from teola_core.engines.opaque_llm import OpaqueModelEngine
from teola_core.engines.protocol import Call, EngineLimits, PerCallEngine
from teola_core.ir.kinds import PrimitiveKind
from teola_llamaindex.scope import QueryContext


def context_of(call: Call) -> QueryContext:
    """The context `call` runs in: its query's (`Call.context`), or its module's."""
    if not isinstance(call.context, QueryContext):
        raise TypeError(
            f"{call.node.describe()}: a LlamaIndex component's engine needs the query's context "
            f"(got {type(call.context).__name__}); run the graph through the optimized object"
        )
    return call.context.for_module(call.node.module)


def needs_embedding(retriever: Any) -> bool:
    """`VectorIndexRetriever`'s own test (`_needs_embedding` from 0.13, the store flag before)."""
    check = getattr(retriever, "_needs_embedding", None)
    if callable(check):
        return bool(check())
    return bool(retriever._vector_store.is_embedding_query)


class LlamaIndexLLMEngine(OpaqueModelEngine):
    """A LlamaIndex `LLM`: decode is `complete` (api "complete"/"predict"), `chat` (api "chat"),
    or exactly `complete(prompt)` / `acomplete(prompt)` as a component calls it, its text
    (api "complete_text"; `sync_api`: `complete` even in an async query, off the event loop,
    where the component itself calls the sync method). A DECODE with a `ctx` input calls
    the model in that context (a span a step opened), else in its query's."""

    limits = EngineLimits(concurrency=64, max_batch_items=1)

    def __init__(self, name: str, llm: LLM) -> None:
        self.name = name
        self.llm = llm

    async def generate(self, call: Call, prompt: Any) -> Any:
        ctx = call.inputs["ctx"] if "ctx" in call.inputs else context_of(call)
        api = call.node.config.get("api", "complete")
        if api == "complete_text":
            if call.node.config.get("sync_api", False):
                return (await ctx.blocking(self.llm.complete, prompt)).text
            return (await ctx.call(self.llm.complete, self.llm.acomplete, prompt)).text
        if api == "chat":
            return (await ctx.call(self.llm.chat, self.llm.achat, prompt)).message.content or ""
        formatted = call.node.config.get("formatted", True)
        response = await ctx.call(self.llm.complete, self.llm.acomplete, prompt, formatted=formatted)
        return response.text if api == "predict" else response

    async def stream(self, call: Call) -> AsyncIterator[str]:
        """A pipelined decode's text deltas (api "predict" only), from `astream_complete`."""
        api = call.node.config.get("api", "complete")
        if api != "predict":
            raise TypeError(f"{call.node.describe()}: only text decodes (api 'predict') stream, not {api!r}")
        prompt, formatted = self.prompt_of(call), call.node.config.get("formatted", True)
        text = ""
        try:
            responses = await self.llm.astream_complete(prompt, formatted=formatted)
            async for response in responses:
                # `delta` may be None: then the new text is what `text` grew by.
                delta = response.delta if response.delta is not None else response.text[len(text) :]
                text += delta
                yield delta
        except NotImplementedError:
            if text:
                raise
            # A model that cannot stream: its one completion is the whole stream.
            yield (await self.llm.acomplete(prompt, formatted=formatted)).text


class LlamaIndexEmbeddingEngine(PerCallEngine):
    """EMBED of query bundles with a retriever's embed model, as `_retrieve` / `_aretrieve` embeds.

    With a `ctx` input (a vector retrieval's `_retrieve` span, `vector_retrieval`): the
    model's own sync or async method, as the query was called, in that context; without
    (a decomposed fusion retriever's queries): its async method.
    """

    kinds = frozenset({PrimitiveKind.EMBED})
    limits = EngineLimits(concurrency=16, max_batch_items=1)
    driver_only = True  # the embed model's events and spans belong to the caller's trace

    def __init__(self, name: str, embed_model: BaseEmbedding) -> None:
        self.name = name
        self.embed_model = embed_model

    async def run_call(self, call: Call) -> dict[str, Any]:
        needed = call.node.config["needs_embedding"]
        bundles = call.inputs["texts"]
        ctx = call.inputs.get("ctx")
        vectors = [await self._vector(b, needed, ctx) for b in bundles]
        if call.node.config.get("embedded_queries", False):
            return {
                "vectors": [
                    QueryBundle(query_str=b.query_str, embedding=v) for b, v in zip(bundles, vectors, strict=True)
                ]
            }
        return {"vectors": vectors}

    async def _vector(self, bundle: QueryBundle, needed: bool, ctx: QueryContext | None) -> Any:
        if needed and bundle.embedding is None and len(bundle.embedding_strs) > 0:
            model, queries = self.embed_model, bundle.embedding_strs
            if ctx is not None:
                return await ctx.call(
                    model.get_agg_embedding_from_queries, model.aget_agg_embedding_from_queries, queries
                )
            return await model.aget_agg_embedding_from_queries(queries)
        return bundle.embedding


class LlamaIndexRetrieverEngine(PerCallEngine):
    """A retriever: SEARCH is its whole `retrieve`/`aretrieve`, or a vector retriever's search half.

    The search half with a `ctx` input (`vector_retrieval`): `_get_nodes_with_embeddings` (sync
    queries, with the caller's bundle, which holds its embedding as in `_retrieve`) or
    `_aget_nodes_with_embeddings`, in that context; without (a decomposed fusion retriever's
    queries): `_aretrieve` with the embedding set.
    """

    kinds = frozenset({PrimitiveKind.SEARCH})
    limits = EngineLimits(concurrency=16, max_batch_items=1)
    driver_only = True  # calls the app's retriever in the query's context

    def __init__(self, name: str, retriever: BaseRetriever) -> None:
        self.name = name
        self.retriever = retriever

    async def run_call(self, call: Call) -> dict[str, Any]:
        r = self.retriever
        if "query" in call.inputs:  # the whole retrieval, as the caller would call it
            whole: QueryContext = call.inputs["ctx"]
            return {"nodes": await whole.call(r.retrieve, r.aretrieve, call.inputs["query"])}
        ctx: QueryContext | None = call.inputs.get("ctx")
        if call.node.config.get("embedded_queries", False):
            queries = list(call.inputs["vectors"])
        elif ctx is not None and ctx.sync:  # `_retrieve` searches with the caller's bundle
            queries = list(call.inputs["index"])
        else:
            bundles, vectors = call.inputs["index"], call.inputs["vectors"]
            queries = [QueryBundle(query_str=b.query_str, embedding=v) for b, v in zip(bundles, vectors, strict=True)]
        if ctx is None:
            return {"hits": [await r._aretrieve(q) for q in queries]}
        search = r._get_nodes_with_embeddings, r._aget_nodes_with_embeddings  # type: ignore[attr-defined]
        return {"hits": [await ctx.call(*search, q) for q in queries]}
