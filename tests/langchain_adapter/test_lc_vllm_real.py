"""`ChatOpenAI`/`OpenAI` on a real vLLM server: the warmed prefix is what vLLM then reuses.

Skipped unless TEOLA_VLLM_URL (e.g. http://127.0.0.1:8011) and TEOLA_VLLM_MODEL are set
(`bash scripts/vllm-cpu/run-tests.sh` serves SmolLM2 on vllm-cpu). What the simulated
servers cannot show: the real chat template's rendering of a prefix with the open message
continued (`continue_final_message`) is a token prefix of the chat request vLLM renders,
so the model's own request finds every warmed token in the prefix cache (read from
`/metrics`); and the answers (greedy) equal the plain chain's.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from operator import itemgetter
from typing import Any

import pytest

URL = os.environ.get("TEOLA_VLLM_URL", "").rstrip("/")
MODEL = os.environ.get("TEOLA_VLLM_MODEL", "")
pytestmark = pytest.mark.skipif(
    not (URL and MODEL), reason="set TEOLA_VLLM_URL and TEOLA_VLLM_MODEL (see scripts/vllm-cpu/run-tests.sh)"
)

httpx = pytest.importorskip("httpx")
pytest.importorskip("langchain_openai")
pytest.importorskip("tenacity")

from langchain_core.output_parsers import StrOutputParser  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate  # noqa: E402
from langchain_openai import ChatOpenAI, OpenAI  # noqa: E402

import teola  # noqa: E402
from teola_adapters.simulated.paper_profiles import LLM  # noqa: E402

# Long enough to span several of vllm-cpu's 128-token KV blocks.
INSTRUCTIONS = (
    "You answer questions about the Python standard library. Use the notes when they help, say so when "
    "they do not, keep to two sentences, and never invent a module, a function or a parameter. "
) * 6


async def cache_hits() -> float:
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{URL}/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:prefix_cache_hits"))


def model_args() -> dict[str, Any]:
    """The test models' settings, with an async HTTP client of their own: langchain-openai
    shares one across models by default, whose connections belong to the event loop that
    opened them, so a later test's `asyncio.run` would fail on them, plain or optimized alike."""
    return {
        "base_url": f"{URL}/v1",
        "api_key": "x",
        "model": MODEL,
        "temperature": 0,
        "max_tokens": 12,
        "http_async_client": httpx.AsyncClient(),
    }


def two_calls(first: Any, second: Any, answer_prompt: Any) -> Any:
    """The notes come from a first model call, so the question's prompt prefix is ready earlier."""
    notes = PromptTemplate.from_template("Write one short note about {question}") | first | StrOutputParser()
    return {"notes": notes, "question": itemgetter("question")} | answer_prompt | second | StrOutputParser()


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_the_warmed_prefix_is_reused_by_the_models_own_request(kind: str) -> None:
    nonce = uuid.uuid4().hex  # a prefix new to the server: hits can only come from this run's warm-up
    if kind == "chat":
        llm = ChatOpenAI(**model_args())
        prompt: Any = ChatPromptTemplate.from_messages(
            [("system", f"[{nonce}] {INSTRUCTIONS}"), ("human", "Question: {question}\nNotes: {notes}")]
        )
        engine = "llm:ChatOpenAI"
    else:
        llm = OpenAI(**model_args())
        prompt = PromptTemplate.from_template(f"[{nonce}] {INSTRUCTIONS}\nQuestion: {{question}}\nNotes: {{notes}}\n")
        engine = "llm:OpenAI"
    chain = two_calls(llm, llm, prompt)
    fast = teola.optimize(chain, profiles={engine: LLM})
    assert any("prefill-split" in p for p in fast.plan.main.passes)
    x = {"question": "How do I read a CSV file?"}

    async def run() -> tuple[Any, Any, float]:
        before = await cache_hits()
        got = await fast.ainvoke(x)
        hits = await cache_hits() - before
        return got, await chain.ainvoke(x), hits

    try:
        got, want, hits = asyncio.run(run())
    finally:
        fast.close()
    stats = fast._engines.engines[engine].warmer.stats
    assert stats.failures == 0 and stats.warmups == 1 and stats.warm_tokens >= 128
    # The only blocks of this query's prompts in the cache were the warm-up's (the notes prompt is
    # shorter than a block): the model's own request found every warmed token cached.
    assert hits == stats.warm_tokens
    assert got == want


def test_with_no_profiles_the_plan_learns_to_warm_and_keeps_the_answers() -> None:
    """Issue 18 on a real server: nothing given; the first calls run as LangChain runs them and
    time the notes' model call; from then on the question's prompt start is warmed."""
    nonce = uuid.uuid4().hex
    llm = ChatOpenAI(**model_args())
    prompt = ChatPromptTemplate.from_messages(
        [("system", f"[{nonce}] {INSTRUCTIONS}"), ("human", "Question: {question}\nNotes: {notes}")]
    )
    chain = two_calls(llm, llm, prompt)
    fast = teola.optimize(chain, warn=False)
    assert not fast.on_graph  # nothing known yet: every step seems ready at once
    xs = [{"question": q} for q in ("How do I read a CSV file?", "What does zip do?", "How to sort a dict?")]
    xs.append({"question": "What is a deque?"})

    async def run() -> tuple[list[Any], list[Any]]:
        return [await fast.ainvoke(x) for x in xs], [await chain.ainvoke(x) for x in xs]

    try:
        got, want = asyncio.run(run())
    finally:
        fast.close()
    assert got == want
    assert fast.on_graph and any("prefill-split" in p for p in fast.plan.main.passes)
    stats = fast._engines.engines["llm:ChatOpenAI"].warmer.stats
    assert stats.failures == 0 and stats.warmups + stats.repeats == 1  # the 4th call warmed its prompt start


def test_a_langgraph_fan_out_reads_the_real_servers_load_and_keeps_the_answers() -> None:
    """Zero configuration on real vLLM: its `/metrics` parse (running and waiting requests),
    a burst larger than Teola's starting limit is held and then let through by what the
    server reports, and every answer (greedy) equals plain LangGraph's."""
    from fan_out_graph import fan_out

    inputs = [
        {"items": [f"Name one Python module for task {r}.{i}." for i in range(12)], "answers": []} for r in range(3)
    ]

    async def run() -> tuple[list[Any], list[Any], Any]:
        graph = fan_out(ChatOpenAI(**model_args()))
        plain = await asyncio.gather(*(graph.ainvoke(x) for x in inputs))
        fast = teola.optimize(fan_out(ChatOpenAI(**model_args())))
        await fast.ainvoke({"items": ["Say hi."], "answers": []})
        (calls,) = fast._teola.admission(asyncio.get_running_loop()).servers()
        await calls.settled()
        optimized = await asyncio.gather(*(fast.ainvoke(x) for x in inputs))
        await calls.settled()
        return plain, optimized, calls

    plain, optimized, calls = asyncio.run(run())
    assert optimized == plain
    assert calls.vllm is True and calls.error is None and calls.last is not None
    assert calls.held_total > 0 and calls.limit.readings >= 2 and calls.in_flight == calls.held == 0
