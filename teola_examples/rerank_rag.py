"""RAG with reranking: retrieve k candidates, rerank them with a cross-encoder, answer from the best.

The reranker is a `/rerank` endpoint (TEI, vLLM, Cohere, Jina share the request shape)
called from a lambda, as users commonly wire one in; Teola runs it as a user step.

    python -m teola_examples.rerank_rag
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.runnables import Runnable, RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore

from teola_examples.common import HTTPReranker, demo, questions, rerank_step
from teola_examples.naive_rag import ANSWER


def build_chain(
    llm: BaseChatModel,
    embeddings: Embeddings,
    *,
    corpus: Sequence[str],
    reranker: HTTPReranker,
    k: int = 12,
    top_n: int = 4,
    **_: Any,
) -> Runnable[dict[str, str], str]:
    """`{"question": str}` -> answer."""
    retriever = InMemoryVectorStore.from_texts(list(corpus), embeddings).as_retriever(search_kwargs={"k": k})
    return (
        RunnablePassthrough.assign(candidates=itemgetter("question") | retriever)
        | RunnablePassthrough.assign(context=rerank_step(reranker, top_n))
        | ANSWER
        | llm
        | StrOutputParser()
    )


def inputs(n: int) -> list[dict[str, str]]:
    return [{"question": q} for q in questions(n)]


OPTIMIZE_OPTIONS: dict[str, Any] = {}

if __name__ == "__main__":
    demo(build_chain, inputs(2), **OPTIMIZE_OPTIONS)
