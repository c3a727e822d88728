"""langchain-openai models on an OpenAI-compatible server: real prefix warm-ups, LangChain's answers.

Against the simulated servers (`teola_adapters.simulated.servers`), which serve vLLM's
`/tokenize` and token-id prompts and keep a vLLM-style prefix cache: a PARTIAL_PREFILL of
a `ChatOpenAI`/`OpenAI` prompt sends the ready prefix's whole blocks, and the model's own
request then finds exactly those blocks cached; the answers equal the plain chain's.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from operator import itemgetter
from typing import Any

import pytest

pytest.importorskip("langchain_openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("tenacity")

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_openai import ChatOpenAI, OpenAI, OpenAIEmbeddings

import teola
from teola_adapters.simulated.paper_profiles import EMBEDDER, LLM
from teola_adapters.simulated.servers import SimServers
from teola_examples.common import corpus, format_docs, questions
from teola_langchain.engines import LangChainLLMEngine
from teola_langchain.prefix_warmup import openai_compatible, render

SYSTEM = "You are a careful assistant for a documentation search engine. Answer in plain words. " * 5
# The retriever's embedder has a profile, so the prefill-split pass sees `context` arrive
# later than `question` and prefills the prompt's start while retrieval runs.
PROFILES = {"embed:OpenAIEmbeddings": EMBEDDER, "llm:ChatOpenAI": LLM, "llm:OpenAI": LLM}


@pytest.fixture
def servers() -> Iterator[SimServers]:
    with SimServers(time_scale=0.01) as s:
        yield s


def _retrieval(servers: SimServers) -> Any:
    embeddings = OpenAIEmbeddings(
        base_url=servers.base_url, api_key="x", model="sim-embed", check_embedding_ctx_length=False
    )
    retriever = InMemoryVectorStore.from_texts(corpus(16), embeddings).as_retriever(search_kwargs={"k": 2})
    return itemgetter("question") | retriever | format_docs


def chat_chain(servers: SimServers, model: Any = None) -> tuple[Any, Any]:
    llm = model or ChatOpenAI(base_url=servers.base_url, api_key="x", model="sim-7b", temperature=0, max_tokens=24)
    prompt = ChatPromptTemplate.from_messages(
        [("system", SYSTEM), ("human", "Question: {question}\n\nAnswer from this context only:\n{context}")]
    )
    chain = {"context": _retrieval(servers), "question": itemgetter("question")} | prompt | llm | StrOutputParser()
    return chain, llm


def completion_chain(servers: SimServers) -> tuple[Any, Any]:
    llm = OpenAI(base_url=servers.base_url, api_key="x", model="sim-7b", temperature=0, max_tokens=24)
    prompt = PromptTemplate.from_template(SYSTEM + "\nQuestion: {question}\nContext:\n{context}\nAnswer:")
    chain = {"context": _retrieval(servers), "question": itemgetter("question")} | prompt | llm
    return chain, llm


def llm_engine(fast: Any, name: str) -> LangChainLLMEngine:
    engine = fast._engines.engines[name]
    assert isinstance(engine, LangChainLLMEngine)
    return engine


def inputs(n: int) -> list[dict[str, str]]:
    return [{"question": q} for q in questions(n)]


def test_only_models_sending_to_a_server_of_your_own_are_warmed() -> None:
    assert openai_compatible(ChatOpenAI(base_url="http://127.0.0.1:8000/v1", api_key="x"))
    assert openai_compatible(OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="x"))
    assert not openai_compatible(ChatOpenAI(base_url="https://api.openai.com/v1", api_key="x"))


@pytest.mark.parametrize("build, engine", [(chat_chain, "llm:ChatOpenAI"), (completion_chain, "llm:OpenAI")])
def test_the_warm_up_is_what_the_models_own_request_then_finds_cached(servers, build, engine) -> None:
    chain, _ = build(servers)
    fast = teola.optimize(chain, profiles=PROFILES)
    assert any("prefill-split" in p for p in fast.plan.main.passes)
    x = inputs(1)[0]

    hits: list[int] = []

    async def both() -> tuple[Any, Any]:  # one loop: langchain-openai keeps one async client per URL
        got = await fast.ainvoke(x)  # first, on a fresh server: nothing else cached anything
        hits.append(servers.backend.llm.stats.cache_hit_tokens)  # the server is idle now
        return got, await chain.ainvoke(x)

    try:
        got, want = asyncio.run(both())
    finally:
        fast.close()
    assert got == want
    stats = llm_engine(fast, engine).warmer.stats
    assert stats.warmups == 1 and stats.warm_tokens >= 32 and stats.failures == 0
    assert servers.backend.requests["tokenize"] == 1
    # Teola's query made two LLM requests: the warm-up (nothing cached yet), then the model's own,
    # which found every warmed token cached: the rendered prefix is a token prefix of its prompt.
    assert hits == [stats.warm_tokens]


def test_sync_invoke_and_batch_warm_each_new_prefix_once(servers) -> None:
    chain, _ = chat_chain(servers)
    fast = teola.optimize(chain, profiles=PROFILES)
    xs = inputs(4)
    try:
        want = [chain.invoke(x) for x in xs]  # sync throughout: LangChain's sync client, Teola's loop thread
        assert [fast.invoke(x) for x in xs] == want
        assert fast.batch(xs) == want
    finally:
        fast.close()
    stats = llm_engine(fast, "llm:ChatOpenAI").warmer.stats
    assert stats.warmups == 4 and stats.repeats == 4  # the batch repeated the same four prefixes: sent once
    assert stats.failures == 0 and stats.disabled is None


def test_streamed_expansion_with_warm_ups_keeps_the_answers(servers) -> None:
    from teola_benchmarks.langchain.bench import example_module
    from teola_examples.common import openai_models

    module = example_module("multi_query_rag")
    llm, embeddings = openai_models(servers.base_url)
    chain = module.build_chain(llm, embeddings, corpus=corpus(16))
    fast = teola.optimize(chain, profiles=PROFILES, **module.OPTIMIZE_OPTIONS)
    assert any("decode-pipelining" in p for p in fast.plan.main.passes)
    xs = module.inputs(3)

    async def both() -> tuple[list[Any], list[Any]]:
        return [await chain.ainvoke(x) for x in xs], list(await asyncio.gather(*(fast.ainvoke(x) for x in xs)))

    try:
        plain, optimized = asyncio.run(both())
    finally:
        fast.close()
    assert optimized == plain


def test_a_server_without_vllms_endpoints_answers_the_same_and_is_asked_once() -> None:
    with SimServers(time_scale=0.01, vllm_api=False) as servers:
        chain, _ = chat_chain(servers)
        fast = teola.optimize(chain, profiles=PROFILES)
        xs = inputs(3)
        try:
            assert [fast.invoke(x) for x in xs] == [chain.invoke(x) for x in xs]
        finally:
            fast.close()
    stats = llm_engine(fast, "llm:ChatOpenAI").warmer.stats
    assert stats.warmups == 0 and stats.failures == 1  # 404 on /tokenize: never asked again
    assert stats.disabled is not None and "404" in stats.disabled


def test_a_vllm_engine_given_for_the_model_does_its_warm_ups(servers) -> None:
    from teola_adapters.vllm_http import VLLMHTTPEngine

    chain, llm = chat_chain(servers)
    server = VLLMHTTPEngine(servers.root_url, "sim-7b")
    fast = teola.optimize(chain, profiles=PROFILES, engines=[(llm, server)])
    xs = inputs(2)
    try:
        assert [fast.invoke(x) for x in xs] == [chain.invoke(x) for x in xs]
    finally:
        fast.close()
    assert (
        server.stats.warmups == 2
        and server.stats.warm_tokens == llm_engine(fast, "llm:ChatOpenAI").warmer.stats.warm_tokens
    )


def test_failing_warm_ups_fail_alone_and_stop_after_three(servers) -> None:
    from teola_adapters.vllm_http import VLLMHTTPEngine

    with socket.socket() as s:  # a port nothing listens on: every warm-up is refused
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    chain, llm = chat_chain(servers)
    fast = teola.optimize(chain, profiles=PROFILES, engines=[(llm, VLLMHTTPEngine(dead, "sim-7b", retries=0))])
    stats = llm_engine(fast, "llm:ChatOpenAI").warmer.stats
    stopped = []
    try:
        for x in inputs(5):
            assert fast.invoke(x) == chain.invoke(x)
            stopped.append(stats.disabled is not None)
    finally:
        fast.close()
    assert stopped == [False, False, True, True, True]  # two failures in a row are tolerated, the third stops
    assert stats.failures == 3 and stats.warmups == 0
    assert stats.disabled is not None and "3 warm-ups failed in a row" in stats.disabled


def test_a_warm_up_is_sent_not_waited_for(servers) -> None:
    """`start` returns once the warm-up is on its way: the model's own request, sent next,
    queues behind it at the server instead of waiting for its answer."""
    from langchain_core.messages import SystemMessage

    from teola_adapters.vllm_http import PrefixWarmer, VLLMHTTPEngine
    from teola_langchain.components.prompts import PromptPrefix

    class HeldWarmUps(VLLMHTTPEngine):
        """The real engine, whose warm-ups go out only when the test says so."""

        release: asyncio.Event

        async def warm(self, ids: Any) -> int:
            await self.release.wait()
            return await super().warm(ids)

    async def run() -> None:
        server = HeldWarmUps(servers.root_url, "sim-7b")
        server.release = asyncio.Event()
        warmer = PrefixWarmer(server)
        llm = ChatOpenAI(base_url=servers.base_url, api_key="x", model="sim-7b", max_tokens=8)
        ready = PromptPrefix(messages=(SystemMessage(SYSTEM),), open_role="human", open_text="Question: ")
        prefix = render(llm, llm, ready)
        sending = await warmer.start(prefix)
        assert sending is not None and not sending.done() and warmer.stats.warmups == 0
        assert await warmer.start(prefix) is None and warmer.stats.repeats == 1  # on its way: not twice
        server.release.set()
        assert await sending > 0 and warmer.stats.warmups == 1
        assert await warmer.start(prefix) is None and warmer.stats.repeats == 2  # warmed just now

    asyncio.run(run())
