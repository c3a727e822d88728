"""Advanced RAG: indexing, query expansion, multi-query search, rerank, synthesis.

Modules in order: indexing (embed 48 chunks, ingest), query expansion (the LLM writes
3 search queries, one per line), retrieval (embed the queries, search top 4 each,
merge), rerank (top 3 of the merged hits), synthesis (LLM answer). The shape of the
paper's advanced-RAG workload and of the Ayo README's example.
"""

from __future__ import annotations

from teola_benchmarks.workflow import Module, ModuleEnv, WorkflowTemplate
from teola_benchmarks.workloads.base import Workload
from teola_benchmarks.workloads.common import EXPAND_MARKER, FakeModel, flatten_unique
from teola_benchmarks.workloads.naive_rag import ANSWER_TOKENS, build_indexing, build_synthesis, make_query
from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.split_units import Lines
from teola_core.ir.types import PortType

N_QUERIES = 3
TOP_K = 4
RERANK_TOP_K = 3
EXPANSION_TEMPLATE = EXPAND_MARKER.format(n=N_QUERIES) + "\nQuestion: {question}\nQueries:"


def build_expansion(b: GraphBuilder, env: ModuleEnv) -> dict[str, Value]:
    prompt = b.format(EXPANSION_TEMPLATE, question=env["question"])
    out = b.llm(prompt, engine="llm", max_tokens=64, split_unit=Lines(), expected_items=N_QUERIES, name="expand")
    assert out.items is not None
    return {"queries": out.items}


def build_retrieval(b: GraphBuilder, env: ModuleEnv) -> dict[str, Value]:
    vectors = b.embed(env["queries"], engine="embedder", items=N_QUERIES)
    hits = b.search(vectors, env["index"], engine="vectordb", top_k=TOP_K, items=N_QUERIES)
    docs = b.call(flatten_unique, {"hits": hits}, name="merge_hits", inline=True)
    return {"candidates": docs}


def build_rerank(b: GraphBuilder, env: ModuleEnv) -> dict[str, Value]:
    ranked = b.rerank(
        env["question"], env["candidates"], engine="reranker", top_k=RERANK_TOP_K, items=N_QUERIES * TOP_K
    )
    return {"docs": ranked}


TEMPLATE = WorkflowTemplate(
    "advanced_rag",
    inputs={"doc_id": PortType.TEXT, "question": PortType.TEXT, "chunks": PortType.TEXTS},
    modules=[
        Module("indexing", build_indexing),
        Module("expansion", build_expansion),
        Module("retrieval", build_retrieval),
        Module("rerank", build_rerank),
        Module("synthesis", build_synthesis),
    ],
    outputs=("answer",),
)

WORKLOAD = Workload(
    name="advanced_rag",
    description="advanced RAG: 48-chunk indexing, expansion to 3 queries, top-4 search each, rerank to 3, answer",
    template=lambda _scale: TEMPLATE,
    make_query=make_query,
    model=FakeModel(answer_tokens=ANSWER_TOKENS),
)
