"""Multi-query RAG: the LLM writes N search queries, one per line; retrieve for each; answer.

The shape of LangChain's multi-query recipe (`generate_queries | retriever.map() |
get_unique_union`). The line parser is Teola's `LineListOutputParser` (the same parse
as the recipe's own `LineListOutputParser`): Teola recognises it by class and hands
each query to retrieval as soon as its line is complete, while the LLM writes the rest.
A parser class of your own would run as an opaque step (same answer, no pipelining).

    python -m teola_examples.multi_query_rag
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.vectorstores import InMemoryVectorStore

from teola_examples.common import demo, format_docs, questions
from teola_langchain.components.parsers import LineListOutputParser

N_QUERIES = 4

ANSWER = ChatPromptTemplate.from_messages(
    [
        (
            "system",
            "You are a careful assistant. Answer the question using only the context passages. "
            "Keep the answer short and precise.",
        ),
        ("human", "Context:\n{context}\n\nQuestion: {question}"),
    ]
)


def expansion_prompt(n: int) -> ChatPromptTemplate:
    return ChatPromptTemplate.from_messages(
        [
            ("system", "You are an AI assistant that helps search a vector database."),
            (
                "human",
                f"Write {n} different search queries, one per line, for the question below. "
                "Write only the queries.\nQuestion: {question}",
            ),
        ]
    )


def unique_union(hits: list[list[Document]]) -> str:
    """The documents of all queries, first occurrence wins, as one context block."""
    seen: set[str] = set()
    docs = []
    for per_query in hits:
        for d in per_query:
            if d.page_content not in seen:
                seen.add(d.page_content)
                docs.append(d)
    return format_docs(docs)


def build_chain(
    llm: BaseChatModel,
    embeddings: Embeddings,
    *,
    corpus: Sequence[str],
    n_queries: int = N_QUERIES,
    k: int = 3,
    **_: Any,
) -> Runnable[dict[str, str], str]:
    """`{"question": str}` -> answer."""
    retriever = InMemoryVectorStore.from_texts(list(corpus), embeddings).as_retriever(search_kwargs={"k": k})
    generate_queries = expansion_prompt(n_queries) | llm | LineListOutputParser()
    retrieval = generate_queries | retriever.map() | RunnableLambda(unique_union)
    return {"context": retrieval, "question": itemgetter("question")} | ANSWER | llm | StrOutputParser()


def inputs(n: int) -> list[dict[str, str]]:
    return [{"question": q} for q in questions(n)]


# Decode pipelining needs to know how many items the expansion writes (a planning hint).
OPTIMIZE_OPTIONS: dict[str, Any] = {"expected_items": N_QUERIES}

if __name__ == "__main__":
    demo(build_chain, inputs(2), **OPTIMIZE_OPTIONS)
