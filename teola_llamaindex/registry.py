"""One engine per user component, named after its class: what the traced graphs run on.

engines = EngineRegistry()
engines.llm(llm)               # "llm:MockLLM" (a prefix-warming engine for a vLLM client)
engines.retriever(retriever)   # "retriever:VectorIndexRetriever"
engines.engines                # the `EngineSet` a runtime takes
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.llms import LLM

from teola_core.engines.protocol import Engine, EngineSet
from teola_llamaindex.engines import Contexts, LlamaIndexEmbeddingEngine, LlamaIndexRetrieverEngine
from teola_llamaindex.prefix_warmup import llm_engine
from teola_llamaindex.rerank import LlamaIndexRerankEngine


class EngineRegistry:
    """One engine per component object, named after its class; builds the `EngineSet`.

    `warm_prefix`: for `OpenAILike` / `OpenAI` completion models, warm the ready prefix
    of a split prefill on the model's server (see `prefix_warmup`). `contexts`: the
    running queries' contexts, which the engines read by query id.
    """

    def __init__(self, *, warm_prefix: bool = True) -> None:
        self.engines = EngineSet()
        self.warm_prefix = warm_prefix
        self.contexts: Contexts = {}

    def llm(self, llm: LLM) -> str:
        return self._get(llm, "llm", lambda name: llm_engine(name, llm, self.contexts, warm_prefix=self.warm_prefix))

    def embedding(self, embed_model: BaseEmbedding) -> str:
        return self._get(embed_model, "embed", lambda name: LlamaIndexEmbeddingEngine(name, embed_model))

    def retriever(self, retriever: BaseRetriever) -> str:
        """The engine of whole retrievals (`retrieve` / `aretrieve`)."""
        return self._get(retriever, "retriever", lambda name: LlamaIndexRetrieverEngine(name, retriever))

    def vector_search(self, retriever: BaseRetriever) -> str:
        """The engine of a vector retriever's search half (`decompose=True`)."""
        return self._get(retriever, "vectordb", lambda name: LlamaIndexRetrieverEngine(name, retriever))

    def reranker(self, postprocessor: Any) -> str:
        return self._get(postprocessor, "rerank", lambda name: LlamaIndexRerankEngine(name, postprocessor))

    def _get(self, component: object, prefix: str, make: Callable[[str], Engine]) -> str:
        return self.engines.engine_for(component, prefix, make)
