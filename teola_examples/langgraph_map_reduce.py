"""Map-reduce summarization as a LangGraph graph: `Send` one summary per document, then reduce.

The shape of LangChain's summarization how-to ("Summarize text", map-reduce with
LangGraph): a conditional edge from START sends every document to `generate_summary`
(one model call each, in parallel), `collect_summaries` gathers them, and
`generate_final_summary` distils them with one more call (a prompt | model | parser chain).

    python -m teola_examples.langgraph_map_reduce
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from teola_adapters.simulated.text import corpus_words as words
from teola_examples.common import demo

DOCUMENTS = 10
DOCUMENT_WORDS = 300

MAP_PROMPT = ChatPromptTemplate.from_messages([("human", "Write a concise summary of the following:\n\n{context}")])
REDUCE_PROMPT = ChatPromptTemplate.from_messages(
    [
        (
            "human",
            "The following is a set of summaries:\n{docs}\nTake these and distill it into a final, "
            "consolidated summary of the main themes.",
        )
    ]
)


class OverallState(TypedDict):
    contents: list[str]
    summaries: Annotated[list[str], operator.add]
    collapsed_summaries: list[Document]
    final_summary: str


class SummaryState(TypedDict):
    content: str


def build_graph(llm: BaseChatModel, embeddings: Embeddings | None = None, **_: Any) -> Any:
    """`{"contents": [str, ...]}` -> the state with `summaries` and `final_summary`."""
    reduce_chain = REDUCE_PROMPT | llm | StrOutputParser()

    async def generate_summary(state: SummaryState) -> dict[str, Any]:
        prompt = await MAP_PROMPT.ainvoke({"context": state["content"]})
        response = await llm.ainvoke(prompt)
        return {"summaries": [response.content]}

    def map_summaries(state: OverallState) -> list[Send]:
        return [Send("generate_summary", {"content": content}) for content in state["contents"]]

    def collect_summaries(state: OverallState) -> dict[str, Any]:
        return {"collapsed_summaries": [Document(summary) for summary in state["summaries"]]}

    async def generate_final_summary(state: OverallState) -> dict[str, Any]:
        docs = "\n\n".join(d.page_content for d in state["collapsed_summaries"])
        return {"final_summary": await reduce_chain.ainvoke({"docs": docs})}

    builder = StateGraph(OverallState)
    builder.add_node("generate_summary", generate_summary)
    builder.add_node("collect_summaries", collect_summaries)
    builder.add_node("generate_final_summary", generate_final_summary)
    builder.add_conditional_edges(START, map_summaries, ["generate_summary"])
    builder.add_edge("generate_summary", "collect_summaries")
    builder.add_edge("collect_summaries", "generate_final_summary")
    builder.add_edge("generate_final_summary", END)
    return builder.compile()


def inputs(n: int, documents: int = DOCUMENTS) -> list[dict[str, list[str]]]:
    """`n` inputs of `documents` synthetic documents each (a deterministic function of the index)."""
    return [{"contents": [" ".join(words(f"doc-{i}/{j}", DOCUMENT_WORDS)) for j in range(documents)]} for i in range(n)]


def answer(output: dict[str, Any]) -> Any:
    """What the benchmark compares between systems."""
    return output["summaries"], output["final_summary"]


OPTIMIZE_OPTIONS: dict[str, Any] = {}

if __name__ == "__main__":
    demo(build_graph, inputs(2), **OPTIMIZE_OPTIONS)
