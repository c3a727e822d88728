"""`teola.optimize(chain, engines=...)`: run a component of the chain on an engine you choose."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from lc_fakes import EchoChat, _prompt_text, answer, format_docs, make_store

import teola
from teola_core.engines.protocol import Call, CallResult, Engine
from teola_core.ir.kinds import LLM_KINDS, PrimitiveKind
from teola_core.ir.types import KVHandle
from teola_langchain.engines import LangChainEmbeddingEngine, LangChainLLMEngine, LangChainVectorStoreEngine

PROMPT = ChatPromptTemplate.from_messages([("system", "Answer briefly."), ("human", "{context}\n\nQ: {question}")])


def rag(llm: Any, store: Any) -> Any:
    retriever = store.as_retriever(search_kwargs={"k": 2})
    context = itemgetter("question") | retriever | format_docs
    return {"context": context, "question": itemgetter("question")} | PROMPT | llm | StrOutputParser()


class Recording(Engine):
    """Runs every call on another engine and remembers the kinds it ran."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.name = f"recording:{inner.name}"
        self.kinds = inner.kinds
        self.limits = inner.limits
        self.ran: list[PrimitiveKind] = []

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        self.ran.extend(c.node.kind for c in calls)
        return await self.inner.run(calls)

    async def stream(self, call: Call) -> Any:
        self.ran.append(call.node.kind)
        async for delta in self.inner.stream(call):
            yield delta


INPUTS = [{"question": q} for q in ("cats", "rivers", "chess")]


def test_pairs_choose_the_engine_of_one_component() -> None:
    llm, store = EchoChat(), make_store()
    chain = rag(llm, store)
    recorded: list[Recording] = []

    def recording_store(component: Any, default: Engine) -> Engine | None:
        if component is store:
            recorded.append(Recording(default))
            return recorded[0]
        return None

    fast = teola.optimize(chain, engines=recording_store)
    try:
        assert fast.batch(INPUTS) == chain.batch(INPUTS)
    finally:
        fast.close()
    (engine,) = recorded
    assert engine.ran == [PrimitiveKind.SEARCH] * len(INPUTS)
    assert "vectordb:InMemoryVectorStore: Recording" in fast.explain()


class EchoEngine(Engine):
    """An engine that answers as `EchoChat` does, on the values Teola's LangChain engines take."""

    name = "echo-engine"
    kinds = LLM_KINDS

    def __init__(self) -> None:
        self.ran: list[PrimitiveKind] = []

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        self.ran.extend(c.node.kind for c in calls)
        return [self._one(c) for c in calls]

    def _one(self, call: Call) -> CallResult:
        kind = call.node.kind
        if kind == PrimitiveKind.PARTIAL_PREFILL:
            return {"kv": KVHandle(self.name, call.inputs["prefix"])}
        if kind in (PrimitiveKind.PREFILL, PrimitiveKind.FULL_PREFILL):
            return {"kv": KVHandle(self.name, call.inputs["prompt"])}
        messages = call.inputs["kv"].prompt.to_messages()  # a LangChain PromptValue
        return {"text": AIMessage(content=answer(_prompt_text(messages), "echo", 3))}


def test_a_list_of_pairs_matches_by_identity_even_for_unhashable_components() -> None:
    llm, store = EchoChat(), make_store()
    twin = EchoChat()  # equal to llm, but another object: keeps Teola's default engine
    chain = rag(llm, store) | (lambda s: s) | twin | StrOutputParser()
    mine = EchoEngine()
    fast = teola.optimize(chain, engines=[(llm, mine)])
    try:
        assert asyncio.run(fast.abatch(INPUTS)) == asyncio.run(chain.abatch(INPUTS))
    finally:
        fast.close()
    assert set(mine.ran) == {PrimitiveKind.PREFILL, PrimitiveKind.DECODE}
    assert mine.ran.count(PrimitiveKind.DECODE) == len(INPUTS)
    assert fast._engines.engines["llm:EchoChat"] is mine
    assert isinstance(fast._engines.engines["llm:EchoChat#2"], LangChainLLMEngine)


class StoreSearch(Engine):
    """SEARCH on a LangChain store by its async by-vector search (no query context needed)."""

    name = "store-search"
    kinds = frozenset({PrimitiveKind.SEARCH})

    def __init__(self, store: Any) -> None:
        self.store = store
        self.searched = 0

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        results: list[CallResult] = []
        for call in calls:
            kwargs = call.node.config.get("search_kwargs", {})
            vectors = call.inputs["vectors"]
            self.searched += len(vectors)
            results.append({"hits": [await self.store.asimilarity_search_by_vector(v, **kwargs) for v in vectors]})
        return results


def test_a_dict_works_for_hashable_components() -> None:
    llm, store = EchoChat(), make_store()
    chain = rag(llm, store)
    searcher = StoreSearch(store)
    fast = teola.optimize(chain, engines={store: searcher})
    try:
        assert [fast.invoke(x) for x in INPUTS] == [chain.invoke(x) for x in INPUTS]
    finally:
        fast.close()
    assert searcher.searched == len(INPUTS)


def test_the_chooser_sees_every_component_with_its_default_engine() -> None:
    llm, store = EchoChat(), make_store()
    seen: list[tuple[str, str]] = []

    def choose(component: Any, default: Engine) -> None:
        seen.append((type(component).__name__, type(default).__name__))

    teola.optimize(rag(llm, store), engines=choose).close()
    assert sorted(seen) == [
        ("DeterministicFakeEmbedding", LangChainEmbeddingEngine.__name__),
        ("EchoChat", LangChainLLMEngine.__name__),
        ("InMemoryVectorStore", LangChainVectorStoreEngine.__name__),
    ]


def test_a_component_the_chain_does_not_use_is_an_error() -> None:
    llm, store = EchoChat(), make_store()
    other = EchoChat()
    with pytest.raises(ValueError, match=r"does not use them.*EchoChat"):
        teola.optimize(rag(llm, store), engines=[(other, Recording(_Nothing()))])


class _Nothing(Engine):
    name = "nothing"
    kinds = frozenset({PrimitiveKind.EMBED})

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        return [{"vectors": []} for _ in calls]


def test_an_engine_that_cannot_run_the_role_is_refused() -> None:
    llm, store = EchoChat(), make_store()
    with pytest.raises(TypeError, match=r"_Nothing cannot run EchoChat's primitives.*decode"):
        teola.optimize(rag(llm, store), engines=[(llm, _Nothing())])
    with pytest.raises(TypeError, match="not a Teola Engine"):
        teola.optimize(rag(llm, store), engines=[(llm, "vllm")])
    with pytest.raises(TypeError, match="pairs"):
        teola.optimize(rag(llm, store), engines=[llm])
