"""The example query engines `teola bench --llamaindex` runs (llama-index-core 0.12 and 0.14).

fusion_query_engine: `RetrieverQueryEngine` over a `QueryFusionRetriever` (the question
and 3 generated queries, reciprocal-rank fused) with the default compact synthesizer.
On 0.14 its `aretrieve` awaits the query generation (`acomplete`); on 0.12 it calls the
sync `complete` from the event loop (see `examples.fusion_rag`).
"""

from __future__ import annotations

from collections.abc import Callable

from llama_index.core import VectorStoreIndex
from llama_index.core.llms import LLM
from llama_index.core.query_engine import RetrieverQueryEngine

from teola_benchmarks.llamaindex.data import fusion_retriever


def fusion_query_engine(llm: LLM, index: VectorStoreIndex) -> RetrieverQueryEngine:
    return RetrieverQueryEngine.from_args(fusion_retriever(llm, index), llm=llm)


QUERY_ENGINES: dict[str, Callable[[LLM, VectorStoreIndex], RetrieverQueryEngine]] = {
    "fusion_query_engine": fusion_query_engine,
}
