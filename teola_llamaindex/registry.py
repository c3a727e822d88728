"""One engine per user component, named after its class: what the traced graphs run on.

engines = EngineRegistry()
engines.llm(llm)               # "llm:MockLLM" (a prefix-warming engine for a vLLM client)
engines.retriever(retriever)   # "retriever:VectorIndexRetriever"
engines.engines                # the `EngineSet` a runtime takes

Which engine runs a component can be chosen (`engine_choices`, the `engines=` option of
`teola.optimize`, as for LangChain: `teola_core.engines.choices`). A chosen engine runs
the primitives of the component's role (`ROLE_KINDS`) with the values Teola's own
engines (`engines.py`, `rerank.py`) take and give: a retriever's SEARCH `query` (a
`QueryBundle` or str) and `ctx` -> `nodes` (`NodeWithScore`s; a `VectorIndexRetriever` given
an engine this way runs whole on it, not decomposed); EMBED `texts` (bundles) -> `vectors` and
the vector SEARCH `vectors`, `index` (bundles) -> `hits` of a decomposed one (its embed
model's and its own engines, each also given the `ctx` the framework calls run in); an LLM's
primitives as `decompose=True` traces them; RERANK `query`, `docs` -> `docs`. Teola cannot
check what it computes against the component.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.llms import LLM

from teola_core.engines.choices import ComponentEngines, EngineChoices, EngineOption
from teola_core.ir.kinds import LLM_KINDS, PrimitiveKind
from teola_llamaindex.engines import LlamaIndexEmbeddingEngine, LlamaIndexRetrieverEngine
from teola_llamaindex.prefix_warmup import llm_engine
from teola_llamaindex.rerank import LlamaIndexRerankEngine

# What an engine must run for each role a component can have in a traced graph.
ROLE_KINDS: dict[str, frozenset[PrimitiveKind]] = {
    "llm": LLM_KINDS,
    "embed": frozenset({PrimitiveKind.EMBED}),
    "retriever": frozenset({PrimitiveKind.SEARCH}),
    "vectordb": frozenset({PrimitiveKind.SEARCH}),
    "rerank": frozenset({PrimitiveKind.RERANK}),
}


def engine_choices(option: EngineOption) -> EngineChoices:
    """The `engines=` option of a LlamaIndex drop-in (see the module docstring)."""
    return EngineChoices(option, ROLE_KINDS)


class EngineRegistry(ComponentEngines):
    """One engine per component object, named after its class; builds the `EngineSet`.

    `choices`: the `engines=` option (default: Teola's own engine for every component).
    `warm_prefix`: for `OpenAILike` / `OpenAI` completion models, warm the ready prefix
    of a split prefill on the model's server (see `prefix_warmup`).
    """

    def __init__(self, choices: EngineChoices | None = None, *, warm_prefix: bool = True) -> None:
        super().__init__(choices or engine_choices(None))
        self.warm_prefix = warm_prefix

    def llm(self, llm: LLM) -> str:
        return self._get(llm, "llm", lambda name: llm_engine(name, llm, warm_prefix=self.warm_prefix))

    def embedding(self, embed_model: BaseEmbedding) -> str:
        return self._get(embed_model, "embed", lambda name: LlamaIndexEmbeddingEngine(name, embed_model))

    def retriever(self, retriever: BaseRetriever) -> str:
        """The engine of whole retrievals (`retrieve` / `aretrieve`)."""
        return self._get(retriever, "retriever", lambda name: LlamaIndexRetrieverEngine(name, retriever))

    def chooses_whole(self, retriever: BaseRetriever) -> bool:
        """True when `engines=` gives `retriever` an engine of its own for whole retrievals (a
        chooser function is asked with the default whole-retrieval engine): it then runs whole."""
        default = LlamaIndexRetrieverEngine(f"retriever:{type(retriever).__name__}", retriever)
        chosen = self.choices.chooser(retriever, default)
        return chosen is not None and chosen is not default

    def vector_search(self, retriever: BaseRetriever) -> str:
        """The engine of a vector retriever's search half (a decomposed `VectorIndexRetriever`)."""
        return self._get(retriever, "vectordb", lambda name: LlamaIndexRetrieverEngine(name, retriever))

    def reranker(self, postprocessor: Any) -> str:
        return self._get(postprocessor, "rerank", lambda name: LlamaIndexRerankEngine(name, postprocessor))
