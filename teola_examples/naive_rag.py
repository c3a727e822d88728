"""Naive RAG: retrieve the question's top-k chunks, answer from them.

python -m teola_examples.naive_rag
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.vectorstores import InMemoryVectorStore

from teola_examples.common import demo, format_docs, questions

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


def build_chain(
    llm: BaseChatModel, embeddings: Embeddings, *, corpus: Sequence[str], k: int = 4, **_: Any
) -> Runnable[dict[str, str], str]:
    """`{"question": str}` -> answer."""
    retriever = InMemoryVectorStore.from_texts(list(corpus), embeddings).as_retriever(search_kwargs={"k": k})
    return (
        {
            "context": itemgetter("question") | retriever | RunnableLambda(format_docs),
            "question": itemgetter("question"),
        }
        | ANSWER
        | llm
        | StrOutputParser()
    )


def inputs(n: int) -> list[dict[str, str]]:
    return [{"question": q} for q in questions(n)]


OPTIMIZE_OPTIONS: dict[str, Any] = {}

if __name__ == "__main__":
    demo(build_chain, inputs(2), **OPTIMIZE_OPTIONS)
