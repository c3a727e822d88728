"""LangChain's RAG tutorial as a LangGraph graph: `retrieve -> generate` over a vector store.

The graph of "Build a RAG App" (python.langchain.com), with the tutorial's prompt
(`rlm/rag-prompt`, inlined: the hub needs a network): function nodes that call the
vector store and the chat model themselves.

    python -m teola_examples.langgraph_rag
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.vectorstores import InMemoryVectorStore
from langgraph.graph import START, StateGraph

from teola_examples.common import demo, questions

RAG_PROMPT = ChatPromptTemplate.from_messages(
    [
        (
            "human",
            "You are an assistant for question-answering tasks. Use the following pieces of retrieved context "
            "to answer the question. If you don't know the answer, just say that you don't know. Use three "
            "sentences maximum and keep the answer concise.\nQuestion: {question} \nContext: {context} \nAnswer:",
        )
    ]
)


class State(TypedDict):
    question: str
    context: list[Document]
    answer: str


def build_graph(llm: BaseChatModel, embeddings: Embeddings, *, corpus: Sequence[str], k: int = 4, **_: Any) -> Any:
    """`{"question": str}` -> `{"question", "context", "answer"}` (the tutorial's graph)."""
    vector_store = InMemoryVectorStore.from_texts(list(corpus), embeddings)

    async def retrieve(state: State) -> dict[str, Any]:
        return {"context": await vector_store.asimilarity_search(state["question"], k=k)}

    async def generate(state: State) -> dict[str, Any]:
        docs_content = "\n\n".join(doc.page_content for doc in state["context"])
        messages = await RAG_PROMPT.ainvoke({"question": state["question"], "context": docs_content})
        response = await llm.ainvoke(messages)
        return {"answer": response.content}

    builder = StateGraph(State).add_sequence([retrieve, generate])
    builder.add_edge(START, "retrieve")
    return builder.compile()


def inputs(n: int) -> list[dict[str, str]]:
    return [{"question": q} for q in questions(n)]


def answer(output: dict[str, Any]) -> Any:
    """What the benchmark compares between systems."""
    return output["answer"]


OPTIMIZE_OPTIONS: dict[str, Any] = {}

if __name__ == "__main__":
    demo(build_graph, inputs(2), **OPTIMIZE_OPTIONS)
