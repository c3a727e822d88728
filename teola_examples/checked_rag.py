"""RAG with a screening check: retrieval (k candidates, reranked) and an LLM check of the question,
written as two chained `.assign`s.

The check reads only the question, so it need not wait for the retrieval: LangChain runs
the two `.assign`s one after the other; Teola proves from the check's prompt that it reads
only "question" and starts it with the retrieval (`teola_langchain/tracing/early_steps.py`). The
same chain with one `.assign(context=..., check=...)` (`build_one_assign`) already runs
both at once in plain LangChain: the benchmark runs that spelling plain beside it.

    python -m teola_examples.checked_rag
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore

from teola_examples.common import HTTPReranker, demo, questions, rerank_step

CHECK = ChatPromptTemplate.from_messages(
    [
        ("system", "You screen questions for a technical help desk."),
        (
            "human",
            "Can this question be answered from product documentation? Say yes or no, with one short reason."
            "\n\nQuestion: {question}",
        ),
    ]
)
ANSWER = ChatPromptTemplate.from_messages(
    [
        (
            "system",
            "You are a careful assistant. Answer the question using only the context passages. "
            "Keep the answer short and precise.",
        ),
        ("human", "Context:\n{context}\n\nScreening note: {check}\n\nQuestion: {question}"),
    ]
)


def _parts(
    llm: BaseChatModel,
    embeddings: Embeddings,
    *,
    corpus: Sequence[str],
    reranker: HTTPReranker,
    k: int = 12,
    top_n: int = 4,
    **_: Any,
) -> dict[str, Runnable[Any, Any]]:
    """The two analyses: the context (k candidates, the best `top_n` after reranking) and the check."""
    retriever = InMemoryVectorStore.from_texts(list(corpus), embeddings).as_retriever(search_kwargs={"k": k})
    candidates = {"question": itemgetter("question"), "candidates": itemgetter("question") | retriever}
    return {"context": candidates | rerank_step(reranker, top_n), "check": CHECK | llm | StrOutputParser()}


def build_chain(llm: BaseChatModel, embeddings: Embeddings, **options: Any) -> Runnable[dict[str, str], str]:
    """`{"question": str}` -> answer, the retrieval and the check as two chained `.assign`s
    (`options`: `corpus`, `reranker`, and `k`, `top_n` as for `_parts`)."""
    parts = _parts(llm, embeddings, **options)
    return (
        RunnablePassthrough.assign(context=parts["context"])
        | RunnablePassthrough.assign(check=parts["check"])
        | ANSWER
        | llm
        | StrOutputParser()
    )


def build_one_assign(llm: BaseChatModel, embeddings: Embeddings, **options: Any) -> Runnable[dict[str, str], str]:
    """The same chain with one `.assign(context=..., check=...)`: LangChain runs both at once."""
    return RunnablePassthrough.assign(**_parts(llm, embeddings, **options)) | ANSWER | llm | StrOutputParser()


# Other ways to write the same chain, run plain beside it (`teola bench --langchain`).
PLAIN_SPELLINGS = {"one_assign": build_one_assign}


def inputs(n: int) -> list[dict[str, str]]:
    return [{"question": q} for q in questions(n)]


OPTIMIZE_OPTIONS: dict[str, Any] = {}

if __name__ == "__main__":
    demo(build_chain, inputs(2), **OPTIMIZE_OPTIONS)
