"""Which retrievers Teola traces into primitives, and how (the rest run as one call).

- exactly `VectorIndexRetriever`: EMBED + SEARCH (`retrieval`);
- exactly `QueryFusionRetriever` over such retrievers: query generation, per-query
  EMBED + SEARCH, fusion (`fusion`), unless `fusion.why_not_traced` says why not.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.retrievers.fusion_retriever import QueryFusionRetriever

from teola_core.ir.builder import GraphBuilder, Value
from teola_llamaindex.engines import EngineRegistry
from teola_llamaindex.fusion import trace_fusion, why_not_traced
from teola_llamaindex.retrieval import decomposable, trace_retrieval


def traceable(retriever: Any) -> bool:
    """True when `trace_retriever` can trace `retriever` (see the module docstring)."""
    if type(retriever) is QueryFusionRetriever:
        return why_not_traced(retriever) is None
    return decomposable(retriever)


def trace_retriever(b: GraphBuilder, engines: EngineRegistry, retriever: Any, query: Value, ctx: Value) -> Value:
    """The primitives of `retriever.(a)retrieve(query)` (it must be `traceable`); the nodes' Value."""
    if type(retriever) is QueryFusionRetriever:
        return trace_fusion(b, engines, retriever, query, ctx)
    return trace_retrieval(b, engines, retriever, query, ctx)
