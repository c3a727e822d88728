"""Which retrievers become which primitives.

    nodes = trace_retriever(b, engines, retriever, query, ctx, decompose=False)

By default every retriever is one SEARCH primitive on its own engine that runs the
retriever's own `retrieve` / `aretrieve` (so its spans, events and callbacks are its
own). With `decompose=True`: exactly `VectorIndexRetriever` becomes EMBED + SEARCH
(`vector_retrieval`), and exactly `QueryFusionRetriever` over such retrievers becomes
query generation, per-query EMBED + SEARCH and fusion (`fusion`).
"""

from __future__ import annotations

from typing import Any

from llama_index.core.retrievers.fusion_retriever import QueryFusionRetriever

from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.kinds import Capabilities, PortSpec, PrimitiveKind
from teola_core.ir.types import PortType
from teola_llamaindex.fusion import trace_fusion, why_not_traced
from teola_llamaindex.registry import EngineRegistry
from teola_llamaindex.vector_retrieval import decomposable, trace_vector_retrieval


def decomposes(retriever: Any) -> bool:
    """True when `decompose=True` splits `retriever` into primitives (see the module docstring)."""
    if type(retriever) is QueryFusionRetriever:
        return why_not_traced(retriever) is None
    return decomposable(retriever)


def trace_retriever(
    b: GraphBuilder, engines: EngineRegistry, retriever: Any, query: Value, ctx: Value, *, decompose: bool
) -> Value:
    """The primitives of `retriever.(a)retrieve(query)`; returns the nodes' Value."""
    if decompose and type(retriever) is QueryFusionRetriever and decomposes(retriever):
        return trace_fusion(b, engines, retriever, query, ctx)
    if decompose and decomposable(retriever):
        return trace_vector_retrieval(b, engines, retriever, query, ctx)
    node = b.add(
        PrimitiveKind.SEARCH,
        {"query": query, "ctx": ctx},
        engine=engines.retriever(retriever),
        input_ports=(PortSpec("query", PortType.ANY), PortSpec("ctx", PortType.ANY)),
        output_ports=(PortSpec("nodes", PortType.ANY),),
        caps=Capabilities(),
        name="retrieve",
    )
    return Value(node.id, "nodes")
