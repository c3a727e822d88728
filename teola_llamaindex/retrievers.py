"""Which retrievers become which primitives.

    nodes = trace_retriever(b, engines, retriever, query, ctx, decompose=None)

Exactly `VectorIndexRetriever` becomes EMBED + SEARCH with its own records
(`vector_retrieval`), and exactly `QueryFusionRetriever` its query generation on the LLM's
engine and a step that retrieves and fuses, inside its own records (`fusion`), unless
`decompose=False` or `engines=` gives the retriever an engine of its own. Every other
retriever is one SEARCH primitive on its own engine that runs the retriever's own
`retrieve` / `aretrieve` (so its spans, events and callbacks are its own). With
`decompose=True`, a `QueryFusionRetriever` over vector retrievers streams its generated
queries into per-query EMBED + SEARCH (`fusion.trace_fusion`; its records then differ).
"""

from __future__ import annotations

from typing import Any

from llama_index.core.retrievers.fusion_retriever import QueryFusionRetriever

from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.kinds import Capabilities, PortSpec, PrimitiveKind
from teola_core.ir.types import PortType
from teola_llamaindex.fusion import trace_fusion, trace_fusion_records, why_not_traced
from teola_llamaindex.registry import EngineRegistry
from teola_llamaindex.vector_retrieval import decomposable, trace_vector_retrieval


def decomposes(retriever: Any) -> bool:
    """True when `decompose=True` splits `retriever` into primitives (see the module docstring)."""
    if type(retriever) is QueryFusionRetriever:
        return why_not_traced(retriever) is None
    return decomposable(retriever)


def trace_retriever(
    b: GraphBuilder, engines: EngineRegistry, retriever: Any, query: Value, ctx: Value, *, decompose: bool | None
) -> Value:
    """The primitives of `retriever.(a)retrieve(query)`; returns the nodes' Value.

    `decompose`: the drop-in's option (None: the default, see the module docstring).
    """
    split = decompose or (decompose is None and not engines.chooses_whole(retriever))
    if type(retriever) is QueryFusionRetriever and split:
        if decompose and decomposes(retriever):
            return trace_fusion(b, engines, retriever, query, ctx)
        return trace_fusion_records(b, engines, retriever, query, ctx)
    if decomposable(retriever) and split:
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
