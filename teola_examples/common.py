"""What the examples share: a synthetic corpus and questions, clients for the servers, a runner."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from typing import Any

import httpx
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import Runnable, RunnableLambda

import teola
from teola_adapters.simulated.text import corpus_words, make_chunks, make_question

CORPUS_CHUNKS = 64
CHUNK_WORDS = 60


def corpus(n: int = CORPUS_CHUNKS, words_per_chunk: int = CHUNK_WORDS) -> list[str]:
    """A deterministic synthetic knowledge base (the benchmark workloads' vocabulary)."""
    return make_chunks("kb", n, words_per_chunk)


def questions(n: int) -> list[str]:
    return [make_question(f"question-{i}") for i in range(n)]


def texts(n: int, words_per_text: int = 120) -> list[str]:
    """Documents to analyse (the `.assign` pipeline's inputs)."""
    return [" ".join(corpus_words(f"text-{i}", words_per_text)) for i in range(n)]


def format_docs(docs: Sequence[Document]) -> str:
    return "\n\n".join(d.page_content for d in docs)


def openai_models(base_url: str, max_tokens: int = 256) -> tuple[BaseChatModel, Embeddings]:
    """`ChatOpenAI` and `OpenAIEmbeddings` on an OpenAI-compatible server (vLLM, TEI, ...)."""
    from langchain_openai import ChatOpenAI, OpenAIEmbeddings

    llm = ChatOpenAI(base_url=base_url, api_key="x", model="sim-7b", temperature=0, max_tokens=max_tokens)
    embeddings = OpenAIEmbeddings(base_url=base_url, api_key="x", model="sim-embed", check_embedding_ctx_length=False)
    return llm, embeddings


class HTTPReranker:
    """A cross-encoder behind a `/rerank` endpoint (Cohere/Jina/TEI/vLLM request shape).

    `rerank`/`arerank` return the documents best first, cut to `top_n`.
    """

    def __init__(self, base_url: str, model: str = "sim-rerank") -> None:
        self.url = base_url.rstrip("/") + "/rerank"
        self.model = model

    def _body(self, query: str, docs: Sequence[Document], top_n: int) -> dict[str, Any]:
        return {"model": self.model, "query": query, "documents": [d.page_content for d in docs], "top_n": top_n}

    def rerank(self, query: str, docs: Sequence[Document], top_n: int) -> list[Document]:
        with httpx.Client() as client:
            r = client.post(self.url, json=self._body(query, docs, top_n))
        r.raise_for_status()
        return [docs[x["index"]] for x in r.json()["results"]]

    async def arerank(self, query: str, docs: Sequence[Document], top_n: int) -> list[Document]:
        async with httpx.AsyncClient() as client:
            r = await client.post(self.url, json=self._body(query, docs, top_n))
        r.raise_for_status()
        return [docs[x["index"]] for x in r.json()["results"]]


def rerank_step(reranker: HTTPReranker, top_n: int) -> Runnable[dict[str, Any], str]:
    """`{"question", "candidates"}` -> the best `top_n` candidates as context, reranked by `reranker`
    (a lambda, as users commonly wire a reranker in: Teola runs it as a user step)."""

    def rerank(x: dict[str, Any]) -> str:
        return format_docs(reranker.rerank(x["question"], x["candidates"], top_n))

    async def arerank(x: dict[str, Any]) -> str:
        return format_docs(await reranker.arerank(x["question"], x["candidates"], top_n))

    return RunnableLambda(rerank, afunc=arerank, name="rerank")


def demo(build: Callable[..., Runnable[Any, Any]], inputs: list[Any], **options: Any) -> None:
    """Run `build(llm, embeddings, ...)` plain and optimized on `inputs`; print both answers.

    Uses `OPENAI_BASE_URL` if set, else starts the simulated servers for the run.
    """
    base_url = os.environ.get("OPENAI_BASE_URL")
    if base_url:
        _demo(build, inputs, base_url, options)
        return
    from teola_adapters.simulated.servers import SimServers

    with SimServers(time_scale=0.2) as servers:
        _demo(build, inputs, servers.base_url, options)


def _demo(build: Callable[..., Runnable[Any, Any]], inputs: list[Any], base_url: str, options: dict[str, Any]) -> None:
    llm, embeddings = openai_models(base_url)
    chain = build(llm, embeddings, reranker=HTTPReranker(base_url), corpus=corpus())
    fast = teola.optimize(chain, **options)

    async def both() -> tuple[list[Any], list[Any]]:
        plain = await asyncio.gather(*(chain.ainvoke(x) for x in inputs))
        optimized = await fast.abatch(inputs)
        return plain, optimized

    plain, optimized = asyncio.run(both())
    for x, a, b in zip(inputs, plain, optimized, strict=True):
        print(f"input:     {x}\nlangchain: {a}\nteola:     {b}\nequal:     {a == b}\n")
    print(fast.explain())
