"""Multi-query RAG with LangChain's own `MultiQueryRetriever` (langchain-classic).

`MultiQueryRetriever.from_llm(retriever, llm)` asks the model for 3 versions of the
question (its default prompt), retrieves for each and returns the unique union. Teola
recognises the retriever and its line parser: each version goes to retrieval as soon as
its line is written, while the model writes the next. Needs `pip install
langchain-classic`.

    python -m teola_examples.multi_query_retriever
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from langchain_classic.retrievers.multi_query import MultiQueryRetriever
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.vectorstores import InMemoryVectorStore

from teola_examples.common import demo, format_docs, questions
from teola_examples.multi_query_rag import ANSWER


def build_chain(
    llm: BaseChatModel, embeddings: Embeddings, *, corpus: Sequence[str], k: int = 3, **_: Any
) -> Runnable[dict[str, str], str]:
    """`{"question": str}` -> answer."""
    retriever = InMemoryVectorStore.from_texts(list(corpus), embeddings).as_retriever(search_kwargs={"k": k})
    context = itemgetter("question") | MultiQueryRetriever.from_llm(retriever, llm) | RunnableLambda(format_docs)
    return {"context": context, "question": itemgetter("question")} | ANSWER | llm | StrOutputParser()


def inputs(n: int) -> list[dict[str, str]]:
    return [{"question": q} for q in questions(n)]


# Nothing to say: the retriever's default prompt asks for 3 queries, Teola plans for them.
OPTIMIZE_OPTIONS: dict[str, Any] = {}

if __name__ == "__main__":
    demo(build_chain, inputs(2), **OPTIMIZE_OPTIONS)
