"""The demo's multi-query RAG chain, in plain LangChain (nothing Teola-specific in it).

    question -> expand (3 search queries, one per line) -> retrieve each -> merge -> answer

The expansion and the answer prompts open with instructions shared by every question,
and the answer prompt puts the question before the retrieved context, so the part of the
prompt that is ready before retrieval ends is a prefix (what prefill split can use).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnableLambda

from teola_langchain.components.parsers import LineListOutputParser

EXPAND_SYSTEM = (
    "You rewrite a user's question about the Python standard library into exactly three short search "
    "queries for a documentation search engine. Write one query per line, with no numbering, no bullets "
    "and no other text."
)
ANSWER_SYSTEM = (
    "You are a concise assistant for questions about the Python standard library. Answer the question in "
    "two or three sentences using only the documentation excerpts given after it. If the excerpts do not "
    "contain the answer, say that you do not know."
)

QUESTIONS = (
    "How do I serialize a Python object to a JSON string?",
    "What does functools.lru_cache do?",
    "How can I run a shell command and capture its output?",
    "How do I parse command-line arguments?",
    "What is a dataclass and how do I define one?",
    "How do I read rows from a CSV file?",
    "How do I wait for several asyncio tasks at once?",
    "How do I create a temporary directory?",
)


def merge_documents(results: list[list[Document]], limit: int = 4) -> str:
    """The unique retrieved paragraphs, in order of first appearance (at most `limit`), as context."""
    seen: dict[str, Document] = {}
    for docs in results:
        for doc in docs:
            seen.setdefault(doc.page_content, doc)
    return "\n\n".join(doc.page_content for doc in list(seen.values())[:limit])


def build_chain(llm: Any, retriever: Any) -> Runnable[dict[str, str], str]:
    """The multi-query RAG chain over a chat model and a retriever; input {"question": ...}."""
    expand_prompt = ChatPromptTemplate.from_messages([("system", EXPAND_SYSTEM), ("human", "{question}")])
    answer_prompt = ChatPromptTemplate.from_messages(
        [("system", ANSWER_SYSTEM), ("human", "Question: {question}\n\nDocumentation:\n{context}")]
    )
    expand = expand_prompt | llm | LineListOutputParser()
    context = expand | retriever.map() | RunnableLambda(merge_documents)
    return {"question": itemgetter("question"), "context": context} | answer_prompt | llm | StrOutputParser()
