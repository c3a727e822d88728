"""Graphs and helpers shared by the Ray backend tests (they run in the driver only)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from teola_core.ir.builder import GraphBuilder
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import MergeMode
from teola_core.ir.types import PortType
from teola_core.runtime.base import PrimitiveSpan


def run(coro: Awaitable[Any], timeout: float = 90.0) -> Any:
    """Run a test coroutine; a hang fails the test instead of blocking the suite."""

    async def guarded() -> Any:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(guarded())


class Spans:
    def __init__(self) -> None:
        self.spans: list[PrimitiveSpan] = []

    def on_span(self, span: PrimitiveSpan) -> None:
        self.spans.append(span)


def embed_only(stages: int = 3) -> Graph:
    b = GraphBuilder("embed_only")
    docs = b.input("docs", PortType.TEXTS)
    parts = [b.embed(docs[2 * i : 2 * i + 2], engine="emb", items=2) for i in range(stages)]
    b.output(vectors=b.aggregate(parts, MergeMode.CONCAT))
    return b.build()


def embed_one() -> Graph:
    b = GraphBuilder("embed_one")
    b.output(vectors=b.embed(b.input("docs", PortType.TEXTS), engine="emb"))
    return b.build()


def chat() -> Graph:
    b = GraphBuilder("chat")
    prompt = b.format("Q: {q}", q=b.input("q", PortType.TEXT))
    b.output(answer=b.llm(prompt, engine="llm", max_tokens=8).text)
    return b.build()


def rag() -> Graph:
    """Embed the question, then ask the LLM (two engines, in sequence)."""
    b = GraphBuilder("rag")
    q = b.input("q", PortType.TEXT)
    vectors = b.embed(b.call(lambda s: [s], {"s": q}, inline=True), engine="emb")
    prompt = b.format("Q: {q} {v}", q=q, v=vectors)
    b.output(answer=b.llm(prompt, engine="llm", max_tokens=8).text, vectors=vectors)
    return b.build()
