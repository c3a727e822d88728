"""Document QA with naive RAG: index the query's document, retrieve, answer.

Modules in order: indexing (embed 48 chunks, ingest), retrieval (embed the question,
search top 4), synthesis (prompt with instruction, question, context; LLM).
"""

from __future__ import annotations

from typing import Any

from teola_adapters.simulated.text import make_chunks, make_question
from teola_benchmarks.workflow import Module, ModuleEnv, WorkflowTemplate
from teola_benchmarks.workloads.base import Workload
from teola_benchmarks.workloads.common import (
    ANSWER_INSTRUCTION,
    FakeModel,
    docs_to_context,
    first_hits,
    single,
)
from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.types import PortType

N_CHUNKS = 48
CHUNK_TOKENS = 100
TOP_K = 4
ANSWER_TOKENS = 48
SYNTHESIS_TEMPLATE = ANSWER_INSTRUCTION + "Question: {question}\nContext:\n{context}\nAnswer:"


def build_indexing(b: GraphBuilder, env: ModuleEnv) -> dict[str, Value]:
    chunks = env["chunks"]
    n = len(env.query["chunks"])
    vectors = b.embed(chunks, engine="embedder", items=n)
    index = b.ingest(chunks, vectors, engine="vectordb", items=n, collection=env.query["doc_id"])
    return {"index": index}


def build_retrieval(b: GraphBuilder, env: ModuleEnv) -> dict[str, Value]:
    queries = b.call(single, {"question": env["question"]}, name="as_list", inline=True)
    vectors = b.embed(queries, engine="embedder", items=1)
    hits = b.search(vectors, env["index"], engine="vectordb", top_k=TOP_K, items=1)
    docs = b.call(first_hits, {"hits": hits}, name="first_hits", inline=True)
    return {"docs": docs}


def build_synthesis(b: GraphBuilder, env: ModuleEnv) -> dict[str, Value]:
    context = b.call(docs_to_context, {"docs": env["docs"]}, name="context", inline=True)
    prompt = b.format(SYNTHESIS_TEMPLATE, question=env["question"], context=context)
    answer = b.llm(prompt, engine="llm", max_tokens=ANSWER_TOKENS, name="answer")
    return {"answer": answer.text}


def make_query(i: int) -> dict[str, Any]:
    doc_id = f"doc-{i}"
    return {"doc_id": doc_id, "question": make_question(doc_id), "chunks": make_chunks(doc_id, N_CHUNKS, CHUNK_TOKENS)}


TEMPLATE = WorkflowTemplate(
    "naive_rag",
    inputs={"doc_id": PortType.TEXT, "question": PortType.TEXT, "chunks": PortType.TEXTS},
    modules=[
        Module("indexing", build_indexing),
        Module("retrieval", build_retrieval),
        Module("synthesis", build_synthesis),
    ],
    outputs=("answer",),
)

WORKLOAD = Workload(
    name="naive_rag",
    description="document QA with naive RAG (48 chunks indexed per query, top-4 retrieval, 48-token answer)",
    template=lambda _scale: TEMPLATE,
    make_query=make_query,
    model=FakeModel(answer_tokens=ANSWER_TOKENS),
)
