"""The paper-setting profiles and engine set: the stated facts hold, a whole RAG graph runs."""

from __future__ import annotations

import asyncio

import pytest

from teola_adapters.simulated import SimLLM, SimReplicas, paper_engines, paper_profiles
from teola_adapters.simulated.paper_profiles import EMBEDDER, LLM
from teola_core.ir.builder import GraphBuilder
from teola_core.ir.graph import Graph
from teola_core.ir.split_units import Lines
from teola_core.ir.types import PortType
from teola_core.runtime.reference import evaluate


def test_embedder_matches_the_papers_measurement() -> None:
    """48 chunks: batch 4 -> 1.8 s, batch 16 -> 1.35 s; throughput stops growing at 16."""
    assert 12 * EMBEDDER.latency("embed", 4) == pytest.approx(1.8)
    assert 3 * EMBEDDER.latency("embed", 16) == pytest.approx(1.35)
    assert EMBEDDER.max_efficient_batch("embed") == 16


def test_llm_profile_is_a_7b_on_one_3090() -> None:
    assert 2_000 < 4096 / LLM.latency("prefill", 4096) < 5_000  # a few thousand tokens/s
    steps = [LLM.latency("decode", n) for n in (1, 8, 32)]
    assert 0.025 <= steps[0] < steps[1] < steps[2] <= 0.035  # ~25-35 ms, rising slowly


def test_paper_engines_are_named_and_fresh() -> None:
    a, b = paper_engines(time_scale=0), paper_engines(time_scale=0, prefix_cache=False)
    assert sorted(a.engines) == ["embedder", "llm", "reranker", "vectordb"]
    assert a.profiles() == paper_profiles()
    llm_a, llm_b = a["llm"], b["llm"]
    assert isinstance(llm_a, SimReplicas) and isinstance(llm_b, SimReplicas)
    assert [type(e) for e in llm_a.instances] == [SimLLM, SimLLM]  # the paper's two instances
    first, second = llm_a.instances
    assert first.cache is not None and second.cache is not None and first.cache is not second.cache
    assert all(e.cache is None for e in llm_b.instances) and a["embedder"] is not b["embedder"]
    assert llm_a.limits.instances == 2 and llm_a.limits.concurrency == 2 * first.limits.concurrency


def rag_graph(chunks: list[str]) -> Graph:
    b = GraphBuilder("rag")
    question = b.input("question", PortType.TEXT)
    docs = b.input("chunks", PortType.TEXTS, items=len(chunks))
    with b.module("indexing"):
        index = b.ingest(docs, b.embed(docs, engine="embedder", items=len(chunks)), engine="vectordb", collection="c")
    with b.module("expansion"):
        prompt = b.format("Write 3 queries for: {q}\n", q=question)
        queries = b.llm(prompt, engine="llm", max_tokens=64, split_unit=Lines(), expected_items=3, name="expand").items
        assert queries is not None
    with b.module("retrieval"):
        hits = b.search(b.embed(queries, engine="embedder", items=3), index, engine="vectordb", top_k=3, items=3)
        flat = b.call(lambda hits: [d for h in hits for d in h], {"hits": hits}, inline=True, name="flatten")
        ranked = b.rerank(question, flat, engine="reranker", top_k=2, items=9)
    with b.module("synthesis"):
        context = b.call(lambda docs: " ".join(s.doc.text for s in docs), {"docs": ranked}, inline=True, name="ctx")
        answer = b.llm(b.format("Answer {q} using {c}", q=question, c=context), engine="llm", max_tokens=16).text
    b.output(answer=answer, ranked=ranked)
    return b.build()


def expand(prompt: str, max_tokens: int) -> str:
    if prompt.startswith("Write 3 queries"):
        return "rivers of the north\nkernel threads\nocean climate"
    return " ".join(prompt.split()[:max_tokens])


def test_a_rag_graph_runs_instantly_and_equally_with_and_without_prefix_cache() -> None:
    chunks = [
        f"chunk {i} on {'rivers' if i % 2 else 'kernels'} and {'oceans' if i % 3 else 'threads'}" for i in range(48)
    ]
    graph = rag_graph(chunks)
    inputs = {"question": "what about rivers and oceans", "chunks": chunks}

    async def run(cache: bool) -> dict[str, object]:
        engines = paper_engines(time_scale=0, prefix_cache=cache, responder=expand)
        try:
            return await evaluate(graph, inputs, engines)
        finally:
            await engines.close()

    with_cache, without = asyncio.run(run(True)), asyncio.run(run(False))
    assert with_cache == without
    assert len(with_cache["ranked"]) == 2 and str(with_cache["answer"]).startswith("Answer what about rivers")
