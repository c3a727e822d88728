"""The example QueryPipelines `teola bench --llamaindex` runs (llama-index-core <= 0.12).

multi_query_rag: query expansion (the LLM writes `n_queries` search queries, one per
line) -> one retriever per query, each fed its line -> merge (unique nodes, first
occurrence wins) -> answer prompt -> LLM. fusion_rag: the same done the LlamaIndex
way, a `QueryFusionRetriever` (the question and 3 generated queries, reciprocal-rank
fused) -> answer prompt -> LLM (on 0.12 the plain executor's
`QueryFusionRetriever.aretrieve` generates the queries with the LLM's sync `complete`,
on the event loop: concurrent questions wait for each other's generation there, which
is most of what Teola wins on this example; alone, a question gains ~1.09x).
naive_rag: retrieve -> answer prompt -> LLM.
The prompts follow the simulated servers' `ExampleResponder` instructions.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from llama_index.core import VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.llms import LLM
from llama_index.core.prompts import PromptTemplate
from llama_index.core.query_pipeline import FnComponent, InputComponent, QueryPipeline
from llama_index.core.schema import NodeWithScore

from teola_benchmarks.llamaindex.data import ANSWER, TOP_K, fusion_retriever

EXPAND = (
    "You are an AI assistant that helps search a vector database.\n"
    "Write {n} different search queries, one per line, for the question below. "
    "Write only the queries.\nQuestion: {question}"
)


def _line(i: int) -> Callable[[Any], str]:
    def pick(text: Any) -> str:
        """Line i of the expansion (the question itself if the model wrote fewer lines)."""
        lines = [line.strip() for line in str(text).splitlines() if line.strip()]
        return lines[i] if i < len(lines) else ""

    return pick


def merger(n: int) -> FnComponent:
    """Merge with required keys q0..q{n-1} (an `ArgPackComponent` has none, so it would run first)."""

    def merge(**hits: list[NodeWithScore]) -> str:
        return merge_hits([hits[f"q{i}"] for i in range(n)])

    params = [inspect.Parameter(f"q{i}", inspect.Parameter.KEYWORD_ONLY) for i in range(n)]
    merge.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return FnComponent(fn=merge)


def merge_hits(hits: list[list[NodeWithScore]]) -> str:
    """The unique nodes of every query, in query order, as one context block."""
    seen: set[str] = set()
    texts = []
    for per_query in hits:
        for hit in per_query:
            if hit.node.node_id not in seen:
                seen.add(hit.node.node_id)
                texts.append(hit.node.get_content())
    return "\n\n".join(texts)


def multi_query_rag(llm: LLM, index: VectorStoreIndex, n_queries: int = 4) -> QueryPipeline:
    p = QueryPipeline()
    p.add_modules(
        {
            "input": InputComponent(),
            "expand": PromptTemplate(EXPAND.replace("{n}", str(n_queries))),
            "expand_llm": llm,
            "merge": merger(n_queries),
            "answer": PromptTemplate(ANSWER),
            "answer_llm": llm,
        }
    )
    p.add_link("input", "expand", src_key="question", dest_key="question")
    p.add_link("expand", "expand_llm")
    for i in range(n_queries):
        p.add_modules(
            {f"line{i}": FnComponent(fn=_line(i)), f"retrieve{i}": index.as_retriever(similarity_top_k=TOP_K)}
        )
        p.add_link("expand_llm", f"line{i}")
        p.add_link(f"line{i}", f"retrieve{i}")
        p.add_link(f"retrieve{i}", "merge", dest_key=f"q{i}")
    p.add_link("merge", "answer", dest_key="context")
    p.add_link("input", "answer", src_key="question", dest_key="question")
    p.add_link("answer", "answer_llm")
    return p


def fusion_rag(llm: LLM, index: VectorStoreIndex, n_queries: int = 4) -> QueryPipeline:
    """`naive_rag` over a `QueryFusionRetriever` (LlamaIndex's multi-query retriever)."""
    return naive_rag(llm, index, retriever=fusion_retriever(llm, index, n_queries))


def naive_rag(llm: LLM, index: VectorStoreIndex, retriever: BaseRetriever | None = None) -> QueryPipeline:
    p = QueryPipeline()
    p.add_modules(
        {
            "input": InputComponent(),
            "retrieve": retriever or index.as_retriever(similarity_top_k=TOP_K),
            "merge": merger(1),
            "answer": PromptTemplate(ANSWER),
            "answer_llm": llm,
        }
    )
    p.add_link("input", "retrieve", src_key="question")
    p.add_link("retrieve", "merge", dest_key="q0")
    p.add_link("merge", "answer", dest_key="context")
    p.add_link("input", "answer", src_key="question", dest_key="question")
    p.add_link("answer", "answer_llm")
    return p


EXAMPLES: dict[str, Callable[[LLM, VectorStoreIndex], QueryPipeline]] = {
    "multi_query_rag": multi_query_rag,
    "fusion_rag": fusion_rag,
    "naive_rag": naive_rag,
}
