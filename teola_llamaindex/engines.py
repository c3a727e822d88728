"""The user's own LlamaIndex components, run as Teola engines.

One engine per component object (by identity), so every module and every concurrent
query that uses it shares one engine scheduler; that is what lets calls batch.

- `LlamaIndexLLMEngine`: prefill records the prompt (a LlamaIndex LLM has no prefill
  API, so partial and full prefill are bookkeeping); decode calls the LLM as the node's
  `api` config says: "complete" (default) `llm.acomplete(prompt, formatted=True)`, what
  `LLMCompleteComponent` calls, giving the `CompletionResponse`; "predict" the same call
  giving its `.text`, what `LLM.apredict` computes for a completion model without an
  output parser; "chat" `llm.achat(messages)` giving `.message.content or ""`, what
  `apredict` computes for a chat model. `formatted` (default True) is passed on: False
  for callers that hand the LLM a raw prompt (`QueryFusionRetriever`'s `llm.complete`).
  A pipelined decode streams `llm.astream_complete(prompt, formatted=...)`'s deltas (a
  model that raises `NotImplementedError` for streaming gives its one `acomplete` text).
- `OpenAICompatibleLLMEngine`: the same for an `OpenAILike` / `OpenAI` client (see
  `openai_compat`): decode is still the user's object, and a partial prefill also warms
  the ready prefix in the server's prefix cache through Teola's `VLLMHTTPEngine`.
- `LlamaIndexEmbeddingEngine`: EMBED over query bundles: the query embedding exactly as
  `VectorIndexRetriever._aretrieve` computes it
  (`embed_model.aget_agg_embedding_from_queries(bundle.embedding_strs)`), or the
  bundle's own embedding, or None where the retriever would not embed. With the node's
  `embedded_queries` config each output item is the query itself with its embedding,
  `QueryBundle(query_str, embedding=vector)` (LlamaIndex's embedded query), so a SEARCH
  split per item needs no second, aligned input.
- `LlamaIndexRetrieverEngine`: SEARCH: `retriever._aretrieve(QueryBundle(query_str,
  embedding=vector))`; with the embedding given, the retriever runs only its search and
  node lookup. `BaseRetriever.aretrieve` then resolves `IndexNode`s (recursive
  retrieval) with the caller's bundle, which only the caller knows (with or without the
  embedding: sync and async paths differ), so callers follow SEARCH with
  `retrieval.resolve_objects`; EMBED + SEARCH + that step equal `retriever.(a)retrieve`.
  The bundles come from the `index` input aligned with `vectors`, or, with
  `embedded_queries`, are the `vectors` items themselves (`index` is then the retriever).
- `LlamaIndexRerankEngine`: RERANK with a node postprocessor (see `rerank`).

Models are always called through their async API (as the LangChain adapter does);
user steps follow the caller (see `common.QueryContext`). Every engine returns one
result per call; an exception fails that call only.

Engines that send each call on its own take one call per batch (`max_batch_items=1`,
many batches at once), as the LangChain adapter's do: a batch's results come back
together, when its slowest call is done, so grouping calls that are not computed
together would only make the fast ones wait (an expansion decode of one query held
until another query's answer decode ended). Only engines with a proven joint call
(`rerank.batch_rerank_proof`) take several calls per batch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.llms import LLM
from llama_index.core.schema import QueryBundle

from teola_core.engines.opaque_llm import OpaqueModelEngine
from teola_core.engines.protocol import Call, Engine, EngineLimits, EngineSet, PerCallEngine
from teola_core.ir.kinds import PrimitiveKind


def needs_embedding(retriever: Any) -> bool:
    """`VectorIndexRetriever`'s own test (`_needs_embedding` from 0.13, the store flag before)."""
    check = getattr(retriever, "_needs_embedding", None)
    if callable(check):
        return bool(check())
    return bool(retriever._vector_store.is_embedding_query)


class LlamaIndexLLMEngine(OpaqueModelEngine):
    """A LlamaIndex `LLM` (see the module docstring)."""

    limits = EngineLimits(concurrency=64, max_batch_items=1)  # one call per batch: see the module docstring

    def __init__(self, name: str, llm: LLM) -> None:
        self.name = name
        self.llm = llm

    async def generate(self, call: Call, prompt: Any) -> Any:
        api = call.node.config.get("api", "complete")
        if api == "chat":
            return (await self.llm.achat(prompt)).message.content or ""
        response = await self.llm.acomplete(prompt, formatted=call.node.config.get("formatted", True))
        return response.text if api == "predict" else response

    async def stream(self, call: Call) -> AsyncIterator[str]:
        """A pipelined decode's text deltas (text decodes, api "predict", only: see the module docstring)."""
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
    """Query embeddings of a retriever's embed model (see the module docstring)."""

    kinds = frozenset({PrimitiveKind.EMBED})
    limits = EngineLimits(concurrency=16, max_batch_items=1)

    def __init__(self, name: str, embed_model: BaseEmbedding) -> None:
        self.name = name
        self.embed_model = embed_model

    async def run_call(self, call: Call) -> dict[str, Any]:
        needed = call.node.config["needs_embedding"]
        bundles = call.inputs["texts"]
        vectors = [await self._vector(b, needed) for b in bundles]
        if call.node.config.get("embedded_queries", False):
            return {
                "vectors": [
                    QueryBundle(query_str=b.query_str, embedding=v) for b, v in zip(bundles, vectors, strict=True)
                ]
            }
        return {"vectors": vectors}

    async def _vector(self, bundle: QueryBundle, needed: bool) -> Any:
        if needed and bundle.embedding is None and len(bundle.embedding_strs) > 0:
            return await self.embed_model.aget_agg_embedding_from_queries(bundle.embedding_strs)
        return bundle.embedding


class LlamaIndexRetrieverEngine(PerCallEngine):
    """The search half of a `VectorIndexRetriever` (see the module docstring)."""

    kinds = frozenset({PrimitiveKind.SEARCH})
    limits = EngineLimits(concurrency=16, max_batch_items=1)

    def __init__(self, name: str, retriever: BaseRetriever) -> None:
        self.name = name
        self.retriever = retriever

    async def run_call(self, call: Call) -> dict[str, Any]:
        if call.node.config.get("embedded_queries", False):
            queries = list(call.inputs["vectors"])
        else:
            bundles, vectors = call.inputs["index"], call.inputs["vectors"]
            queries = [QueryBundle(query_str=b.query_str, embedding=v) for b, v in zip(bundles, vectors, strict=True)]
        return {"hits": [await self.retriever._aretrieve(q) for q in queries]}


class EngineRegistry:
    """One engine per component object, named after its class; builds the `EngineSet`.

    `warm_prefix`: for `OpenAILike` / `OpenAI` completion models, warm the ready prefix
    of a split prefill on the model's server (see `openai_compat`); False keeps the
    plain LLM engine.
    """

    def __init__(self, *, warm_prefix: bool = True) -> None:
        self.engines = EngineSet()
        self.warm_prefix = warm_prefix

    def llm(self, llm: LLM) -> str:
        from teola_llamaindex.openai_compat import llm_engine

        return self._get(llm, "llm", lambda name: llm_engine(name, llm, warm_prefix=self.warm_prefix))

    def embedding(self, embed_model: BaseEmbedding) -> str:
        return self._get(embed_model, "embed", lambda name: LlamaIndexEmbeddingEngine(name, embed_model))

    def retriever(self, retriever: BaseRetriever) -> str:
        return self._get(retriever, "vectordb", lambda name: LlamaIndexRetrieverEngine(name, retriever))

    def reranker(self, postprocessor: Any) -> str:
        from teola_llamaindex.rerank import LlamaIndexRerankEngine

        return self._get(postprocessor, "rerank", lambda name: LlamaIndexRerankEngine(name, postprocessor))

    def _get(self, component: object, prefix: str, make: Callable[[str], Engine]) -> str:
        return self.engines.engine_for(component, prefix, make)
