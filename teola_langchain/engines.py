"""The user's own LangChain components, run as Teola engines.

By default an optimized chain runs on what the user built: the chat model or LLM, the
embeddings and the vector store of the original chain. Each component object gets one
engine (by identity), so every step and every query that uses it shares its engine
scheduler, which is what lets calls from concurrent queries batch.

- `LangChainLLMEngine`: prefill records the prompt (a LangChain model has no prefill
  API, so partial and full prefill are bookkeeping); decode calls the step's runnable —
  the model, or the `RunnableBinding` around it — with `ainvoke(prompt, config)`, the
  query's config merged with the bindings' as LangChain merges them; a streamed decode
  (decode pipelining) uses `astream` and yields the chunks' text.
- `LangChainEmbeddingEngine`: `aembed_query` per text, or one `aembed_documents` for a
  whole batch when `retrievers.batchable_embeddings` proves it equal.
- `LangChainVectorStoreEngine`: `asimilarity_search_by_vector(v, **search_kwargs)` per
  vector.

Every engine returns one result per call; an exception fails that call only.

Engines that send each call on its own (the model, per-query embeddings, the store)
take one call per batch (`max_batch_items=1`, many batches at once): a batch's calls
all complete when its slowest does, so grouping calls that are not computed together
would only make the fast ones wait (measured: naive RAG 0.85x of LangChain against a
single-instance embedding server before this, as the queries' embeddings returned
together). Only the proven `aembed_documents` path batches across queries.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseLanguageModel
from langchain_core.messages import BaseMessage
from langchain_core.vectorstores import VectorStore

from teola_core.engines.opaque_llm import OpaqueModelEngine
from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits, EngineSet, PerCallEngine
from teola_core.ir.kinds import PrimitiveKind
from teola_langchain.context import ContextRegistry
from teola_langchain.parsers import ParserItems, output_text
from teola_langchain.retrievers import batchable_embeddings


class LangChainLLMEngine(OpaqueModelEngine):
    """A LangChain chat model or LLM (see the module docstring)."""

    limits = EngineLimits(concurrency=64, max_batch_items=1)  # one call per batch: see the module docstring

    def __init__(self, name: str, model: BaseLanguageModel[Any], contexts: ContextRegistry) -> None:
        self.name = name
        self.model = model
        self._contexts = contexts

    async def generate(self, call: Call, prompt: Any) -> Any:
        return await self._runnable(call).ainvoke(prompt, self._config(call))

    def decode_outputs(self, call: Call, output: Any) -> dict[str, Any]:
        unit = call.node.config.get("split_unit")
        if isinstance(unit, ParserItems):  # the parser's own result from the model output
            return {"text": output, "items": unit.parse_output(output)}
        return super().decode_outputs(call, output)

    async def stream(self, call: Call) -> AsyncIterator[str]:
        async for chunk in self._runnable(call).astream(self.prompt_of(call), self._config(call)):
            yield output_text(chunk) if isinstance(chunk, BaseMessage) else chunk

    def _runnable(self, call: Call) -> Any:
        return call.node.config.get("runnable", self.model)

    def _config(self, call: Call) -> Any:
        return self._contexts[call.query_id].step_config(call.node.config.get("bound_config", ()))


class LangChainEmbeddingEngine(Engine):
    """A LangChain `Embeddings` object (see the module docstring)."""

    kinds = frozenset({PrimitiveKind.EMBED})
    limits = EngineLimits(concurrency=16)

    def __init__(self, name: str, embeddings: Embeddings) -> None:
        self.name = name
        self.embeddings = embeddings
        self.batches_queries = batchable_embeddings(embeddings)
        if not self.batches_queries:
            self.limits = EngineLimits(concurrency=16, max_batch_items=1)

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        texts = [list(c.inputs["texts"]) for c in calls]
        if self.batches_queries:
            flat = [t for ts in texts for t in ts]
            try:
                vectors = await self.embeddings.aembed_documents(flat) if flat else []
            except Exception as exc:
                return [exc for _ in calls]
            results: list[CallResult] = []
            start = 0
            for ts in texts:
                results.append({"vectors": vectors[start : start + len(ts)]})
                start += len(ts)
            return results
        return list(await asyncio.gather(*(self._queries(ts) for ts in texts), return_exceptions=True))

    async def _queries(self, texts: list[str]) -> dict[str, Any]:
        vectors = await asyncio.gather(*(self.embeddings.aembed_query(t) for t in texts))
        return {"vectors": list(vectors)}


class LangChainVectorStoreEngine(PerCallEngine):
    """A LangChain `VectorStore`: similarity search by vector (see the module docstring)."""

    kinds = frozenset({PrimitiveKind.SEARCH})
    limits = EngineLimits(concurrency=16, max_batch_items=1)

    def __init__(self, name: str, store: VectorStore) -> None:
        self.name = name
        self.store = store

    async def run_call(self, call: Call) -> dict[str, Any]:
        kwargs = dict(call.node.config.get("search_kwargs", {}))
        hits = await asyncio.gather(
            *(self.store.asimilarity_search_by_vector(v, **kwargs) for v in call.inputs["vectors"])
        )
        return {"hits": list(hits)}


class EngineRegistry:
    """One engine per component object, named after its class; builds the `EngineSet`."""

    def __init__(self, contexts: ContextRegistry) -> None:
        self.contexts = contexts
        self.engines = EngineSet()

    def llm(self, model: BaseLanguageModel[Any]) -> str:
        return self._get(model, "llm", lambda name: LangChainLLMEngine(name, model, self.contexts))

    def embeddings(self, embeddings: Embeddings) -> str:
        return self._get(embeddings, "embed", lambda name: LangChainEmbeddingEngine(name, embeddings))

    def vectorstore(self, store: VectorStore) -> str:
        return self._get(store, "vectordb", lambda name: LangChainVectorStoreEngine(name, store))

    def _get(self, component: object, prefix: str, make: Any) -> str:
        return self.engines.engine_for(component, prefix, make)
