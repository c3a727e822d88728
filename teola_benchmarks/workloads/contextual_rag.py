"""Contextual retrieval with several LLM calls per query.

Before indexing, an LLM call per chunk writes one sentence situating the chunk within
the whole document (all calls share the document as their prompt's prefix); the
contextualised chunks are embedded and ingested; then retrieval, rerank and synthesis.
9 LLM calls per query.
"""

from __future__ import annotations

from typing import Any

from teola_adapters.simulated.text import make_chunks, make_question
from teola_benchmarks.workflow import Module, ModuleEnv, WorkflowTemplate
from teola_benchmarks.workloads.base import Workload
from teola_benchmarks.workloads.common import CONTEXT_MARKER, FakeModel
from teola_benchmarks.workloads.naive_rag import ANSWER_TOKENS, build_retrieval, build_synthesis
from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.types import PortType

N_CHUNKS = 8
CHUNK_TOKENS = 64
CONTEXT_TOKENS = 24
CONTEXT_TEMPLATE = CONTEXT_MARKER + "\nDocument:\n{document}\nChunk:\n{chunk}\nContext:"


def first(items: list[str]) -> str:
    return items[0]


def contextualise(**parts: str) -> list[str]:
    """context_i + chunk_i for every chunk, in chunk order."""
    n = len(parts) // 2
    return [f"{parts[f'context_{i}']} {parts[f'chunk_{i}']}" for i in range(n)]


def build_contexts(b: GraphBuilder, env: ModuleEnv) -> dict[str, Value]:
    chunks = env["chunks"]
    n = len(env.query["chunks"])
    parts: dict[str, Value] = {}
    for i in range(n):
        chunk = b.call(first, {"items": chunks[i : i + 1]}, name=f"chunk_{i}", inline=True)
        prompt = b.format(CONTEXT_TEMPLATE, document=env["document"], chunk=chunk)
        parts[f"context_{i}"] = b.llm(prompt, engine="llm", max_tokens=CONTEXT_TOKENS, name=f"situate_{i}").text
        parts[f"chunk_{i}"] = chunk
    texts = b.call(contextualise, parts, name="contextualise", inline=True)
    return {"contextual_chunks": texts}


def build_indexing(b: GraphBuilder, env: ModuleEnv) -> dict[str, Value]:
    texts = env["contextual_chunks"]
    vectors = b.embed(texts, engine="embedder", items=N_CHUNKS)
    index = b.ingest(texts, vectors, engine="vectordb", items=N_CHUNKS, collection=env.query["doc_id"])
    return {"index": index}


def build_rerank(b: GraphBuilder, env: ModuleEnv) -> dict[str, Value]:
    return {"docs": b.rerank(env["question"], env["docs"], engine="reranker", top_k=3, items=4)}


TEMPLATE = WorkflowTemplate(
    "contextual_rag",
    inputs={"doc_id": PortType.TEXT, "question": PortType.TEXT, "document": PortType.TEXT, "chunks": PortType.TEXTS},
    modules=[
        Module("contexts", build_contexts),
        Module("indexing", build_indexing),
        Module("retrieval", build_retrieval),
        Module("rerank", build_rerank),
        Module("synthesis", build_synthesis),
    ],
    outputs=("answer",),
)


def make_query(i: int) -> dict[str, Any]:
    doc_id = f"ctx-{i}"
    chunks = make_chunks(doc_id, N_CHUNKS, CHUNK_TOKENS)
    return {"doc_id": doc_id, "question": make_question(doc_id), "document": "\n".join(chunks), "chunks": chunks}


WORKLOAD = Workload(
    name="contextual_rag",
    description="contextual retrieval: an LLM call per chunk (8) to situate it, then RAG with rerank (9 LLM calls)",
    template=lambda _scale: TEMPLATE,
    make_query=make_query,
    model=FakeModel(answer_tokens=ANSWER_TOKENS, context_tokens=CONTEXT_TOKENS),
)
