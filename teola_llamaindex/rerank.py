"""Node postprocessors as RERANK primitives, and when a reranker may batch across queries.

    name = engines.reranker(SentenceTransformerRerank(top_n=2))
    nodes = trace_rerank(b, name, postprocessor, query, nodes, ctx, call="bundle")

Every postprocessor is a RERANK on its own engine (`rerank:ClassName`), except the local
filters in `_NOT_RERANKERS`, which stay one call each. A RERANK call is exactly the
original `postprocess_nodes` call; several queries share one engine invocation only
through a batch function registered for the exact class (`register_batch_rerank`).
Why none of LlamaIndex's own rerankers batches: docs/llamaindex.md ("Reranking").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from llama_index.core.postprocessor import (
    AutoPrevNextNodePostprocessor,
    EmbeddingRecencyPostprocessor,
    FixedRecencyPostprocessor,
    KeywordNodePostprocessor,
    LongContextReorder,
    MetadataReplacementPostProcessor,
    NERPIINodePostprocessor,
    PIINodePostprocessor,
    PrevNextNodePostprocessor,
    SentenceEmbeddingOptimizer,
    SentenceTransformerRerank,
    SimilarityPostprocessor,
    TimeWeightedPostprocessor,
)
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle

from teola_core.engines.protocol import Call, CallResult, EngineLimits, JointCallEngine
from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.kinds import Capabilities, PortSpec, PrimitiveKind
from teola_core.ir.types import PortType

# Exact classes that filter, reorder or rewrite nodes locally: one `call` each.
_NOT_RERANKERS: frozenset[type] = frozenset(
    {
        SimilarityPostprocessor,
        KeywordNodePostprocessor,
        PrevNextNodePostprocessor,
        AutoPrevNextNodePostprocessor,
        LongContextReorder,
        MetadataReplacementPostProcessor,
        FixedRecencyPostprocessor,
        EmbeddingRecencyPostprocessor,
        TimeWeightedPostprocessor,
        PIINodePostprocessor,
        NERPIINodePostprocessor,
        SentenceEmbeddingOptimizer,
    }
)
# Rerankers over one local model: one call at a time (concurrent calls only contend).
_ONE_AT_A_TIME: frozenset[type] = frozenset({SentenceTransformerRerank})

Request = tuple[list[NodeWithScore], QueryBundle | None]
BatchRerank = Callable[[Any, list[Request]], list[list[NodeWithScore]]]
_BATCH_PROOFS: dict[type, BatchRerank] = {}


def register_batch_rerank(cls: type, batch: BatchRerank) -> None:
    """Declare that `batch(postprocessor, requests)` equals per-request calls for `cls`.

    `requests` is a list of (nodes, query bundle or None); the result must be, for each,
    exactly `postprocessor.postprocess_nodes(nodes, query_bundle=bundle)` (same objects,
    scores and order), whichever other requests share the call. Applies to that exact
    class, when it keeps `BaseNodePostprocessor`'s async method (which runs the sync one).
    If it raises, each request then runs alone (so it must not change a node before it
    can fail).
    """
    if not (isinstance(cls, type) and issubclass(cls, BaseNodePostprocessor)):
        raise TypeError(f"register_batch_rerank takes a BaseNodePostprocessor class, not {cls!r}")
    _BATCH_PROOFS[cls] = batch


def batch_rerank_proof(postprocessor: Any) -> BatchRerank | None:
    """The registered batch function of the postprocessor's exact class, if it applies."""
    cls = type(postprocessor)
    batch = _BATCH_PROOFS.get(cls)
    if batch is None or cls._apostprocess_nodes is not BaseNodePostprocessor._apostprocess_nodes:
        return None
    return batch


def reranks(postprocessor: Any) -> bool:
    """True when the postprocessor runs as a RERANK primitive (see the module docstring)."""
    return isinstance(postprocessor, BaseNodePostprocessor) and type(postprocessor) not in _NOT_RERANKERS


def trace_rerank(
    b: GraphBuilder, engine: str, postprocessor: Any, query: Value, nodes: Value, ctx: Value, *, call: str
) -> Value:
    """The RERANK primitive for one postprocessor; returns its output nodes' Value.

    `call`: "bundle" (`query` is a QueryBundle, query engines) or "query_str" (`query` is
    the validated `query_str` or None, QueryPipeline's `PostprocessorComponent`).
    """
    node = b.add(
        PrimitiveKind.RERANK,
        {"query": query, "docs": nodes, "ctx": ctx},
        engine=engine,
        config={"call": call, "top_k": getattr(postprocessor, "top_n", None)},
        input_ports=(PortSpec("query", PortType.ANY), PortSpec("docs", PortType.ANY), PortSpec("ctx", PortType.ANY)),
        output_ports=(PortSpec("docs", PortType.ANY),),
        caps=Capabilities(batchable=batch_rerank_proof(postprocessor) is not None),
        name="rerank",
    )
    return Value(node.id, "docs")


class LlamaIndexRerankEngine(JointCallEngine):
    """A node postprocessor as a RERANK engine (see the module docstring)."""

    kinds = frozenset({PrimitiveKind.RERANK})
    driver_only = True  # calls the app's postprocessor in the query's context

    def __init__(self, name: str, postprocessor: Any) -> None:
        super().__init__()
        self.name = name
        self.postprocessor = postprocessor
        self.batch = batch_rerank_proof(postprocessor)
        self.joint = self.batch is not None
        # A joint call is one model call: one at a time, the calls that queue meanwhile form the next.
        concurrency = 1 if self.joint or type(postprocessor) in _ONE_AT_A_TIME else 16
        self.limits = EngineLimits(concurrency=concurrency, max_batch_items=None if self.joint else 1)

    async def run_jointly(self, calls: Sequence[Call]) -> list[CallResult]:
        assert self.batch is not None
        outputs = await asyncio.to_thread(self.batch, self.postprocessor, [self._request(c) for c in calls])
        return [{"docs": out} for out in outputs]

    @staticmethod
    def _request(call: Call) -> Request:
        query = call.inputs["query"]
        if call.node.config["call"] == "query_str":
            query = None if query is None else QueryBundle(query)
        return call.inputs["docs"], query

    async def run_call(self, call: Call) -> dict[str, Any]:
        pp, ctx = self.postprocessor, call.inputs["ctx"]
        nodes, query = call.inputs["docs"], call.inputs["query"]
        if call.node.config["call"] == "query_str":  # `PostprocessorComponent`: the sync method, sync or async
            return {"docs": await ctx.blocking(pp.postprocess_nodes, nodes, query_str=query)}
        return {"docs": await ctx.call(pp.postprocess_nodes, pp.apostprocess_nodes, nodes, query_bundle=query)}
