"""A sequential `.assign` pipeline whose steps are in fact independent.

Summary, key facts and tone of the same text, each by its own LLM call, written one
`.assign` after another (as such pipelines grow), then a final brief that combines them.
LangChain runs the three analyses one after the other; Teola sees from the data that
none reads another's result and runs them together. The same chain written with one
`.assign(summary=..., facts=..., tone=...)` (`build_one_assign`) already runs them
together in plain LangChain: the benchmark runs both spellings plain.

    python -m teola_examples.assign_pipeline
"""

from __future__ import annotations

from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnablePassthrough

from teola_examples.common import demo, texts

SYSTEM = "You are an analyst who writes plain, factual notes."


def _ask(instruction: str) -> ChatPromptTemplate:
    return ChatPromptTemplate.from_messages([("system", SYSTEM), ("human", instruction + "\n\nText:\n{text}")])


SUMMARY = _ask("Summarize the text in about 40 words.")
FACTS = _ask("List the key facts of the text, in about 40 words.")
TONE = _ask("Describe the tone and intended audience of the text in about 32 words.")
BRIEF = ChatPromptTemplate.from_messages(
    [
        ("system", SYSTEM),
        (
            "human",
            "Write a brief for a busy reader in about 40 words.\n\nSummary: {summary}\n\nKey facts: {facts}\n\n"
            "Tone: {tone}",
        ),
    ]
)


def build_chain(llm: BaseChatModel, embeddings: Embeddings | None = None, **_: Any) -> Runnable[dict[str, str], str]:
    """`{"text": str}` -> brief. (`embeddings` is unused: the builders share a signature.)"""
    parse = StrOutputParser()
    return (
        RunnablePassthrough.assign(summary=SUMMARY | llm | parse)
        | RunnablePassthrough.assign(facts=FACTS | llm | parse)
        | RunnablePassthrough.assign(tone=TONE | llm | parse)
        | BRIEF
        | llm
        | parse
    )


def build_one_assign(
    llm: BaseChatModel, embeddings: Embeddings | None = None, **_: Any
) -> Runnable[dict[str, str], str]:
    """The same pipeline with the three analyses in one `.assign`: LangChain runs them concurrently."""
    parse = StrOutputParser()
    analyses = {"summary": SUMMARY | llm | parse, "facts": FACTS | llm | parse, "tone": TONE | llm | parse}
    return RunnablePassthrough.assign(**analyses) | BRIEF | llm | parse


# Other ways to write the same chain, run plain beside it (`teola bench --langchain`).
PLAIN_SPELLINGS = {"one_assign": build_one_assign}


def inputs(n: int) -> list[dict[str, str]]:
    return [{"text": t} for t in texts(n)]


OPTIMIZE_OPTIONS: dict[str, Any] = {}

if __name__ == "__main__":
    demo(build_chain, inputs(2), **OPTIMIZE_OPTIONS)
