"""LangChain's `MultiQueryRetriever` (langchain-classic) as primitives.

What `MultiQueryRetriever.(a)invoke(question)` computes (langchain-classic 1.0,
`langchain_classic/retrievers/multi_query.py`, read at 1.0.8): the queries are
`llm_chain.(a)invoke({"question": question})` (`from_llm` builds `prompt | llm |
LineListOutputParser()`), logged at INFO ("Generated queries: %s") when `verbose`;
with `include_original` the question is appended last; each query goes to the inner
retriever (`invoke` one after another, `ainvoke` all at once); the documents, in query
order, go through `unique_union` (first occurrence wins).

Traced as: the `llm_chain` traced as any chain (so its line parser gives the model's
call a split unit and decode pipelining hands each query to retrieval while the model
writes the next), the inner retriever as EMBED + SEARCH over the queries (batched
across queries, `retrievers.decompose`), the question's own retrieval (with
`include_original`) started at once, and one inline step running the retriever's own
`unique_union` (and its log record). The planning hint for pipelining is the 3 queries
the library's default prompt asks for, unless the `expected_items` option says
otherwise. Callback runs of the retriever's children are not opened (as for every
traced step). Recognised by qualified name, for the langchain-classic versions read.

Runs as one call: an `LLMChain` as `llm_chain` (its dict output is read by key) and an
inner retriever that does not decompose.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever

from teola_langchain.classes import installed_within, qualified_name

CLASSIC = ("langchain-classic", "1.0.0", "1.1")  # distribution, versions read as [first, before)
MULTI_QUERY_RETRIEVER = "langchain_classic.retrievers.multi_query.MultiQueryRetriever"
LINE_LIST_PARSER = "langchain_classic.retrievers.multi_query.LineListOutputParser"
_LLM_CHAIN = "langchain_classic.chains.llm.LLMChain"
_DEFAULT_PROMPT_QUERIES = 3  # "generate 3 different versions of the given user question"


def is_classic(obj: Any, name: str) -> bool:
    """`obj`'s exact class is langchain-classic's `name`, in a version whose source was read."""
    return qualified_name(obj) == name and installed_within(*CLASSIC)[0]


def is_multi_query(retriever: BaseRetriever) -> bool:
    return is_classic(retriever, MULTI_QUERY_RETRIEVER)


def why_opaque(retriever: Any) -> str | None:
    """Why this `MultiQueryRetriever` runs as one call, or None (see the module docstring)."""
    if qualified_name(retriever.llm_chain) == _LLM_CHAIN:
        return "its llm_chain is an LLMChain"
    return None


def planned_queries(retriever: Any) -> int | None:
    """How many queries to plan pipelining for: 3 with the library's own default prompt."""
    from langchain_classic.retrievers.multi_query import DEFAULT_QUERY_PROMPT

    steps = getattr(retriever.llm_chain, "steps", None)
    if steps and steps[0] is DEFAULT_QUERY_PROMPT:
        return _DEFAULT_PROMPT_QUERIES
    return None


def unique_union(retriever: Any) -> Callable[..., list[Document]]:
    """The retriever's own end: its log record, then `unique_union` of the documents in query order."""
    logger = logging.getLogger(type(retriever).__module__)

    def union(
        lines: list[str], generated: list[list[Document]], original: list[list[Document]] | None = None
    ) -> list[Document]:
        if retriever.verbose:
            logger.info("Generated queries: %s", lines)
        documents = [d for docs in generated for d in docs]
        for docs in original or ():
            documents.extend(docs)
        return retriever.unique_union(documents)

    return union
