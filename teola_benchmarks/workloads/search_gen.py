"""Search-engine-empowered generation: a web search API, then RAG over what it returned.

Modules in order: web search (an opaque API call returning 24 passages after 0.4 s),
indexing (embed, ingest), retrieval (embed the question, top 4), synthesis.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from teola_adapters.simulated.text import make_chunks, make_question
from teola_benchmarks.workflow import Module, ModuleEnv, WorkflowTemplate
from teola_benchmarks.workloads.base import Workload
from teola_benchmarks.workloads.common import FakeModel
from teola_benchmarks.workloads.naive_rag import ANSWER_TOKENS, CHUNK_TOKENS, build_retrieval, build_synthesis
from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.types import PortType

N_PASSAGES = 24
SEARCH_API_S = 0.4


def web_search_api(time_scale: float) -> Callable[[str, str], Awaitable[list[str]]]:
    """A stand-in for a search engine API: fixed latency, deterministic passages."""

    async def web_search(doc_id: str, question: str) -> list[str]:
        await asyncio.sleep(SEARCH_API_S * time_scale)
        return make_chunks(f"web/{doc_id}", N_PASSAGES, CHUNK_TOKENS)

    return web_search


def template(time_scale: float) -> WorkflowTemplate:
    def build_web_search(b: GraphBuilder, env: ModuleEnv) -> dict[str, Value]:
        passages = b.call(
            web_search_api(time_scale), {"doc_id": env["doc_id"], "question": env["question"]}, name="web_search"
        )
        return {"chunks": passages}

    def build_indexing(b: GraphBuilder, env: ModuleEnv) -> dict[str, Value]:
        vectors = b.embed(env["chunks"], engine="embedder", items=N_PASSAGES)
        index = b.ingest(env["chunks"], vectors, engine="vectordb", items=N_PASSAGES, collection=env.query["doc_id"])
        return {"index": index}

    return WorkflowTemplate(
        "search_gen",
        inputs={"doc_id": PortType.TEXT, "question": PortType.TEXT},
        modules=[
            Module("web_search", build_web_search),
            Module("indexing", build_indexing),
            Module("retrieval", build_retrieval),
            Module("synthesis", build_synthesis),
        ],
        outputs=("answer",),
    )


def make_query(i: int) -> dict[str, Any]:
    doc_id = f"web-{i}"
    return {"doc_id": doc_id, "question": make_question(doc_id)}


WORKLOAD = Workload(
    name="search_gen",
    description="search-engine-empowered generation: 0.4 s search API, 24 passages indexed, top-4, answer",
    template=template,
    make_query=make_query,
    model=FakeModel(answer_tokens=ANSWER_TOKENS),
)
