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

Runs as one call: an `LLMChain` as `llm_chain` (its dict output is read by key), an
`llm_chain` that does not end in a model and a recognised list parser (with
`include_original` the library appends to its output, which must be a list), one with
configurable fields (the library hands it only the callbacks, so configuration reaches
it only sometimes), and an inner retriever that does not decompose.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableSequence

from teola_langchain.components.classes import class_of, is_classic
from teola_langchain.components.models import language_model
from teola_langchain.components.parsers import returns_list

MULTI_QUERY_RETRIEVER = "langchain_classic.retrievers.multi_query.MultiQueryRetriever"
_DEFAULT_PROMPT_QUERIES = 3  # "generate 3 different versions of the given user question"


def is_multi_query(retriever: BaseRetriever) -> bool:
    return is_classic(retriever, MULTI_QUERY_RETRIEVER)


def why_opaque(retriever: Any) -> str | None:
    """Why this `MultiQueryRetriever` runs as one call, or None (see the module docstring)."""
    from langchain_classic.chains.llm import LLMChain

    chain = retriever.llm_chain
    if isinstance(chain, LLMChain):
        return "its llm_chain is an LLMChain (its dict output is read by key)"
    steps = chain.steps if class_of(chain) is RunnableSequence else []
    if len(steps) < 2 or language_model(steps[-2]) is None or not returns_list(steps[-1]):
        return "its llm_chain does not end in a model and a recognised list parser (its output may not be a list)"
    if chain.config_specs:
        return "its llm_chain has configurable fields (LangChain passes it only the callbacks)"
    return None


def planned_queries(retriever: Any) -> int | None:
    """How many queries to plan pipelining for: 3 with the library's own default prompt."""
    from langchain_classic.retrievers.multi_query import DEFAULT_QUERY_PROMPT

    chain = retriever.llm_chain
    if class_of(chain) is RunnableSequence and chain.steps[0] is DEFAULT_QUERY_PROMPT:
        return _DEFAULT_PROMPT_QUERIES
    return None


def log_queries(retriever: Any) -> Callable[[list[str]], list[str]]:
    """The retriever's log record of the generated queries (when `verbose`), as it logs it.

    Emitted once the model's queries are complete (the library logs then too, before its
    retrievals; here retrieval of the first queries has already started, so a retrieval
    that fails before the model is done ends the query without the record).
    """
    logger = logging.getLogger(type(retriever).__module__)

    def log(lines: list[str]) -> list[str]:
        if retriever.verbose:
            logger.info("Generated queries: %s", lines)
        return lines

    return log


def unique_union(retriever: Any) -> Callable[..., list[Document]]:
    """The retriever's own end: `unique_union` of the documents, in query order."""

    def union(
        lines: list[str],
        generated: list[list[Document]],
        question: str | None = None,
        original: list[list[Document]] | None = None,
    ) -> list[Document]:
        if question is not None:
            # The library appends the question to the very list it logged (its record shows it).
            lines.append(question)
        documents = [d for docs in generated for d in docs]
        for docs in original or ():
            documents.extend(docs)
        return retriever.unique_union(documents)

    return union
