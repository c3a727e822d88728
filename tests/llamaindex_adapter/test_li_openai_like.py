"""`OpenAILike` on Teola's LLM engine path: the user's client answers, Teola warms the prefix.

A fake OpenAI-compatible vLLM server (an `httpx.MockTransport`, shared by the user's
client and Teola's warm-up engine): `/tokenize` gives one token per character (or fails
with the status a test gives),
`/metrics` states a 4-token KV block, `/v1/completions` answers a text prompt with a
function of it and records every request (a token-id prompt is a warm-up).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from li_fakes import make_index
from llama_index.core import PromptTemplate
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.response_synthesizers import get_response_synthesizer

from teola_core.profiles.profile import Curve, LatencyProfile
from teola_llamaindex import TeolaQueryEngine
from teola_llamaindex.engines import LlamaIndexLLMEngine
from teola_llamaindex.prefix_warmup import PrefixWarmingLLMEngine, why_no_warmup

openai_like = pytest.importorskip("llama_index.llms.openai_like")

INDEX = make_index()
BASE = "http://127.0.0.1:18000/v1"
QUERY_FIRST = PromptTemplate("Query: {query_str}\nUse this context:\n{context_str}\nAnswer:")
SLOW = Curve(((1, 0.05),))
PROFILES = {
    "embed:HashEmbedding": LatencyProfile("embed:HashEmbedding", {"embed": SLOW}),
    "vectordb:VectorIndexRetriever": LatencyProfile("vectordb:VectorIndexRetriever", {"search": SLOW}),
    "retriever:VectorIndexRetriever": LatencyProfile("retriever:VectorIndexRetriever", {"search": SLOW}),
}
QUESTIONS = ["what do cats do at dusk?", "how do vector stores answer a query?"]
RETRIEVAL = ("embed:HashEmbedding", "vectordb:VectorIndexRetriever")  # the retriever, decomposed by default


class FakeVLLM:
    """The fake server (see the module docstring)."""

    def __init__(self, *, tokenize_status: int = 200) -> None:
        self.tokenize_status = tokenize_status
        self.tokenizes = 0  # /tokenize requests
        self.prompts: list[str] = []  # text completions, in arrival order
        self.warmups: list[list[int]] = []  # token-id completions
        self.chats: list[Any] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content else {}
        if path == "/tokenize":
            self.tokenizes += 1
            if self.tokenize_status != 200:
                return httpx.Response(self.tokenize_status, json={"detail": "tokenize failed"})
            return httpx.Response(200, json={"tokens": [ord(c) for c in body["prompt"]], "count": 0})
        if path == "/metrics":
            return httpx.Response(200, text='vllm:cache_config_info{block_size="4",gpu_memory_utilization="0.9"} 1.0\n')
        if path == "/v1/completions":
            prompt = body["prompt"]
            if isinstance(prompt, list):
                self.warmups.append(prompt)
                text = "."
            else:
                self.prompts.append(prompt)
                text = f"[{len(prompt)} chars] {prompt[-24:]}"
            return httpx.Response(200, json=_completion(body, text))
        if path == "/v1/chat/completions":
            self.chats.append(body["messages"])
            content = " | ".join(m["content"] for m in body["messages"])[-40:]
            return httpx.Response(200, json=_chat(body, content))
        return httpx.Response(404, json={"detail": f"no route {path}"})


def _completion(body: dict[str, Any], text: str) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 0,
        "model": body["model"],
        "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _chat(body: dict[str, Any], content: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": body["model"],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _llm(server: FakeVLLM, *, chat: bool = False) -> Any:
    transport = httpx.MockTransport(server)
    return openai_like.OpenAILike(
        model="fake-smollm",
        api_base=BASE,
        api_key="x",
        is_chat_model=chat,
        max_tokens=32,
        max_retries=0,
        http_client=httpx.Client(transport=transport),
        async_http_client=httpx.AsyncClient(transport=transport),
    )


def _engine(llm: Any, **synth: Any) -> RetrieverQueryEngine:
    return RetrieverQueryEngine(
        retriever=INDEX.as_retriever(similarity_top_k=3),
        response_synthesizer=get_response_synthesizer(llm=llm, **synth),
    )


def _same(a: Any, b: Any) -> None:
    assert str(a) == str(b)
    assert [(n.node.node_id, n.score) for n in a.source_nodes] == [(n.node.node_id, n.score) for n in b.source_nodes]


def _check(engine: RetrieverQueryEngine, **options: Any) -> TeolaQueryEngine:
    fast = TeolaQueryEngine(engine, **options)
    for q in QUESTIONS:
        expected = engine.query(q)
        _same(fast.query(q), expected)
        _same(asyncio.run(fast.aquery(q)), expected)
    return fast


def _warm_prefixes_precede_their_prompts(server: FakeVLLM) -> None:
    """Each warm-up is the token ids of a leading part of a text prompt the client sent."""
    assert server.warmups
    for ids in server.warmups:
        prefix = "".join(chr(i) for i in ids)
        assert len(ids) % 4 == 0
        assert any(p.startswith(prefix) for p in server.prompts), prefix


@pytest.mark.parametrize("decompose", [False, True])
@pytest.mark.parametrize("template", [None, QUERY_FIRST], ids=["default-qa", "query-first"])
def test_answers_are_the_clients_and_the_ready_prefix_is_warmed(template: Any, decompose: bool) -> None:
    server = FakeVLLM()
    extra = {"text_qa_template": template} if template is not None else {}
    fast = _check(_engine(_llm(server), **extra), profiles=PROFILES, decompose=decompose)
    engine = fast._engines.engines["llm:OpenAILike"]
    assert isinstance(engine, PrefixWarmingLLMEngine)
    assert engine.warm_error is None and engine.warmer.block_size == 4
    # One per new prefix: the default template's ready start is the same for every question,
    # the query-first one's holds the question (asked sync, then async: a repeat).
    stats = engine.warmer.stats
    assert engine.warmups == (len(QUESTIONS) if template is QUERY_FIRST else 1)
    assert stats.warmups + stats.repeats == 2 * len(QUESTIONS) and stats.failures == 0
    _warm_prefixes_precede_their_prompts(server)
    assert "llm:OpenAILike: warms split prefixes on http://127.0.0.1:18000" in fast.explain()
    if template is QUERY_FIRST:  # the warmed prefix holds the question
        warmed = ["".join(chr(i) for i in ids) for ids in server.warmups]
        assert any(QUESTIONS[0][:8] in w for w in warmed)


def test_decomposed_without_a_split_prefill_nothing_is_warmed() -> None:
    server = FakeVLLM()
    fast = _check(_engine(_llm(server)), decompose=True)  # no profiles: the passes see no early prefix
    assert fast._engines.engines["llm:OpenAILike"].warmups == 0
    assert server.warmups == []


def test_a_server_without_tokenize_stops_the_warmups_at_once_and_answers_the_same() -> None:
    server = FakeVLLM(tokenize_status=404)
    fast = _check(_engine(_llm(server)), profiles=PROFILES)  # four queries
    engine = fast._engines.engines["llm:OpenAILike"]
    assert engine.warm_error is not None and "HTTP 404" in engine.warm_error, engine.warm_error
    assert server.tokenizes == 1 and engine.warmer.stats.failures == 1  # never asked again
    assert server.warmups == []
    assert "stopped (the server has no vLLM tokenizer endpoint (HTTP 404))" in fast.explain()


def test_two_failed_warm_ups_in_a_row_are_tolerated_and_the_third_stops_them() -> None:
    """The one rule (`teola_adapters.vllm_http.PrefixWarmer`), as LangChain's adapter has it too."""
    server = FakeVLLM(tokenize_status=503)
    llm = _llm(server)
    plain = _engine(llm, text_qa_template=QUERY_FIRST)
    fast = TeolaQueryEngine(plain, profiles=PROFILES)
    engine = fast._engines.engines["llm:OpenAILike"]
    questions = [*QUESTIONS, "what is a prefix cache?", "why warm a prefix?"]
    stopped = []
    for q in questions:
        _same(fast.query(q), plain.query(q))  # every answer is the client's own, warm-up or not
        stopped.append(engine.warm_error is not None)
    assert stopped == [False, False, True, True]
    assert "3 warm-ups failed in a row" in (engine.warm_error or "")
    assert server.tokenizes == 3 and engine.warmer.stats.failures == 3 and server.warmups == []


def test_chat_models_and_warm_prefix_false_use_the_plain_engine() -> None:
    server = FakeVLLM()
    chat = _llm(server, chat=True)
    assert why_no_warmup(chat) is not None
    fast = _check(_engine(chat), profiles=PROFILES)
    assert fast.engine_names == RETRIEVAL  # nothing to warm: the synthesizer's own call
    fast = _check(_engine(chat), profiles=PROFILES, decompose=True)
    assert type(fast._engines.engines["llm:OpenAILike"]) is LlamaIndexLLMEngine
    assert "no prefix warm-up (a chat model" in fast.explain()
    assert server.chats and server.warmups == []
    fast = _check(_engine(_llm(server)), profiles=PROFILES, warm_prefix=False, decompose=True)
    assert type(fast._engines.engines["llm:OpenAILike"]) is LlamaIndexLLMEngine
    assert _check(_engine(_llm(server)), warm_prefix=False).engine_names == RETRIEVAL


@pytest.mark.parametrize(
    "base, why",
    [("https://api.openai.com/v1", "vLLM"), (BASE, None)],
)
def test_openai_own_api_is_not_warmed(base: str, why: str | None) -> None:
    llm = openai_like.OpenAILike(model="m", api_base=base, api_key="x", is_chat_model=False)
    reason = why_no_warmup(llm)
    assert (reason is None) if why is None else (why in (reason or ""))


def test_openai_class_completion_model_is_warmed() -> None:
    openai_mod = pytest.importorskip("llama_index.llms.openai")
    server = FakeVLLM()
    transport = httpx.MockTransport(server)
    llm = openai_mod.OpenAI(
        model="gpt-3.5-turbo-instruct",
        api_base=BASE,
        api_key="x",
        max_tokens=32,
        max_retries=0,
        http_client=httpx.Client(transport=transport),
        async_http_client=httpx.AsyncClient(transport=transport),
    )
    assert why_no_warmup(llm) is None
    fast = _check(_engine(llm), profiles=PROFILES)
    assert isinstance(fast._engines.engines["llm:OpenAI"], PrefixWarmingLLMEngine)
    _warm_prefixes_precede_their_prompts(server)


def _pipeline_shape(server: FakeVLLM) -> Callable[[], Any]:
    qp = pytest.importorskip("llama_index.core.query_pipeline")

    def build() -> Any:
        p = qp.QueryPipeline()
        p.add_modules(
            {
                "input": qp.InputComponent(),
                "retriever": INDEX.as_retriever(similarity_top_k=2),
                "join": qp.FnComponent(fn=lambda nodes: "\n".join(n.get_content() for n in nodes)),
                "prompt": PromptTemplate("Question: {q}\nContext:\n{context}\nAnswer:"),
                "llm": _llm(server),
            }
        )
        p.add_link("input", "retriever")
        p.add_link("retriever", "join")
        p.add_link("join", "prompt", dest_key="context")
        p.add_link("input", "prompt", dest_key="q")
        p.add_link("prompt", "llm")
        return p

    return build


def test_query_pipeline_prompt_prefix_is_warmed() -> None:
    """QueryPipeline (0.12): PromptTemplate -> OpenAILike; the question's prefix is warmed."""
    import warnings

    from teola_llamaindex import OpaqueModuleWarning, TeolaQueryPipelineExecutor

    server = FakeVLLM()
    pipeline = _pipeline_shape(server)()
    profiles = {**PROFILES, "llm:OpenAILike": LatencyProfile("llm", {"prefill": SLOW, "decode": SLOW})}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OpaqueModuleWarning)
        fast = TeolaQueryPipelineExecutor(pipeline, profiles=profiles)
    for q in QUESTIONS:
        expected = str(pipeline.run(input=q))
        assert str(fast.run(input=q)) == expected
        assert str(asyncio.run(fast.arun(input=q))) == expected
    assert fast._engines.engines["llm:OpenAILike"].warmups == len(QUESTIONS)  # each question's prefix once
    _warm_prefixes_precede_their_prompts(server)
