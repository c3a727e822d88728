"""The simulated servers answer the openai client as an OpenAI-compatible server does."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI, BadRequestError, OpenAI

from teola_adapters.server_load import parse_reading
from teola_adapters.simulated.paper_profiles import LLM
from teola_adapters.simulated.servers import ExampleResponder, SimServers, messages_to_prompt
from teola_adapters.simulated.servers.backend import ScriptedToolCall
from teola_core.scheduler.server_costs import TOKEN_GAP_BOUNDS, ServerCosts
from teola_core.scheduler.server_limit import ServerReading

MESSAGES = [
    {"role": "system", "content": "You help search."},
    {"role": "user", "content": "Write 3 search queries, one per line, for the question below.\nQuestion: why?"},
]


def test_chat_completion_follows_the_responder(servers: SimServers) -> None:
    client = OpenAI(base_url=servers.base_url, api_key="x")
    r = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=100)  # type: ignore[arg-type]
    text = r.choices[0].message.content
    assert text == ExampleResponder()(messages_to_prompt(MESSAGES), 100)
    assert text is not None and len(text.split("\n")) == 3
    assert r.usage is not None and r.usage.completion_tokens == len(text.split())


def test_chat_stream_adds_up_to_the_completion(servers: SimServers) -> None:
    client = OpenAI(base_url=servers.base_url, api_key="x")
    whole = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=100)  # type: ignore[arg-type]
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=100,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len(deltas) > 3  # token by token, not one chunk
    assert "".join(deltas) == whole.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]


def test_completions_and_max_tokens(servers: SimServers) -> None:
    client = OpenAI(base_url=servers.base_url, api_key="x")
    r = client.completions.create(model="m", prompt="Say hello in about 20 words.", max_tokens=5)
    assert len(r.choices[0].text.split()) == 5
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model="m", prompt="Say hello in about 20 words.", max_tokens=5, stream=True)
    )
    assert streamed == r.choices[0].text


def test_embeddings_float_and_base64_agree(servers: SimServers) -> None:
    client = OpenAI(base_url=servers.base_url, api_key="x")
    texts = ["alpha beta gamma", "river market", ""]
    as_b64 = client.embeddings.create(model="e", input=texts)  # the client asks for base64 by default
    as_float = client.embeddings.create(model="e", input=texts, encoding_format="float")
    assert [d.index for d in as_float.data] == [0, 1, 2]
    for a, b in zip(as_b64.data, as_float.data, strict=True):
        assert a.embedding == pytest.approx(b.embedding, abs=1e-6)
    one = client.embeddings.create(model="e", input=texts[1], encoding_format="float")
    assert one.data[0].embedding == as_float.data[1].embedding  # batch-invariant


def test_rerank_orders_by_relevance(servers: SimServers) -> None:
    body = {"query": "river market", "documents": ["alpha beta", "river market policy", "market"], "top_n": 2}
    r = httpx.post(f"{servers.base_url}/rerank", json=body)
    r.raise_for_status()
    results = r.json()["results"]
    assert [x["index"] for x in results] == [1, 2]
    assert results[0]["relevance_score"] >= results[1]["relevance_score"]


@pytest.mark.parametrize("batching", ["dynamic", "request"])
def test_embedding_batching_modes(batching: str) -> None:
    async def burst(base_url: str) -> None:
        client = AsyncOpenAI(base_url=base_url, api_key="x")
        await asyncio.gather(*(client.embeddings.create(model="e", input=[f"text {i}"]) for i in range(8)))

    with SimServers(time_scale=0.05, batching=batching) as s:  # type: ignore[arg-type]
        asyncio.run(burst(s.base_url))
    sizes = s.backend.embed_batch_sizes
    assert sum(sizes) == 8
    if batching == "request":
        assert sizes == [1] * 8
    else:
        assert max(sizes) > 1  # requests that waited for the busy instance were merged


def test_unknown_batching_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="batching"):
        SimServers(batching="greedy")  # type: ignore[arg-type]


def test_vllms_tokenizer_endpoint_renders_chat_prefixes_as_token_prefixes(servers: SimServers) -> None:
    def tokens(body: dict) -> list[int]:
        r = httpx.post(f"{servers.root_url}/tokenize", json={"model": "m", **body})
        r.raise_for_status()
        return r.json()["tokens"]

    full = tokens({"messages": MESSAGES, "add_generation_prompt": True})
    assert full == tokens({"prompt": messages_to_prompt(MESSAGES)})  # the chat request's own tokens
    open_start = [MESSAGES[0], {"role": "user", "content": "Write 3 search"}]
    prefix = tokens({"messages": open_start, "add_generation_prompt": False, "continue_final_message": True})
    assert prefix == full[: len(prefix)] and len(prefix) < len(full)
    whole_first = tokens({"messages": MESSAGES[:1], "add_generation_prompt": False})
    assert whole_first == full[: len(whole_first)]
    both = {"messages": MESSAGES, "add_generation_prompt": True, "continue_final_message": True}
    assert httpx.post(f"{servers.root_url}/tokenize", json=both).status_code == 400


def test_token_id_prompts_fill_the_blocks_the_text_would(servers: SimServers) -> None:
    prompt = " ".join(f"w{i}" for i in range(40))
    ids = httpx.post(f"{servers.root_url}/tokenize", json={"model": "m", "prompt": prompt}).json()["tokens"]
    client = OpenAI(base_url=servers.base_url, api_key="x")
    by_ids = client.completions.create(model="m", prompt=ids[:32], max_tokens=1)
    assert by_ids.choices[0].text == ExampleResponder()(" ".join(prompt.split()[:32]), 1)  # the ids' words
    hits = servers.backend.llm.stats.cache_hit_tokens  # the server is idle between requests
    client.completions.create(model="m", prompt=prompt, max_tokens=1)
    assert servers.backend.llm.stats.cache_hit_tokens - hits == 32  # the text found the two blocks the ids filled
    bad = httpx.post(f"{servers.base_url}/completions", json={"model": "m", "prompt": [10**9], "max_tokens": 1})
    assert bad.status_code == 400
    metrics = httpx.get(f"{servers.root_url}/metrics").text
    assert 'vllm:cache_config_info{block_size="16"' in metrics


def test_without_vllms_endpoints_the_server_is_plain_openai() -> None:
    with SimServers(time_scale=0.0, vllm_api=False) as s:
        assert httpx.post(f"{s.root_url}/tokenize", json={"model": "m", "prompt": "hi"}).status_code == 404
        assert httpx.get(f"{s.root_url}/metrics").status_code == 404
        r = httpx.post(f"{s.base_url}/completions", json={"model": "m", "prompt": [1, 2], "max_tokens": 1})
        assert r.status_code == 400


def test_metrics_report_running_and_waiting_requests_as_vllm_names_them() -> None:
    with SimServers(time_scale=1.0, max_num_seqs=1) as s:
        client = OpenAI(base_url=s.base_url, api_key="x")
        stream = client.completions.create(model="m", prompt="tell a long story", max_tokens=200, stream=True)
        next(iter(stream))  # the first token came: the request runs
        page = httpx.get(f"{s.root_url}/metrics").text
        stream.close()
    assert 'vllm:num_requests_running{model_name="sim"} 1.0' in page
    assert 'vllm:num_requests_waiting{model_name="sim"} 0.0' in page
    assert "vllm:kv_cache_usage_perc{" in page


def test_a_priority_is_refused_unless_the_server_schedules_by_priority() -> None:
    body = {"model": "m", "prompt": "hi", "max_tokens": 1, "priority": 3}
    with SimServers(time_scale=0.0) as fcfs, SimServers(time_scale=0.0, scheduling_policy="priority") as by_priority:
        refused = httpx.post(f"{fcfs.base_url}/completions", json=body)
        assert refused.status_code == 400 and "scheduling policy is 'fcfs'" in refused.text
        assert httpx.post(f"{by_priority.base_url}/completions", json=body).status_code == 200
        bad = httpx.post(
            f"{by_priority.base_url}/chat/completions", json={**body, "messages": MESSAGES, "priority": "hi"}
        )
        assert bad.status_code == 400 and "priority must be an integer" in bad.text
    with pytest.raises(ValueError, match="scheduling_policy must be one of"):
        SimServers(scheduling_policy="lifo")  # type: ignore[arg-type]


def test_a_kv_pool_is_reported_as_vllm_reports_its_cache_and_a_prompt_too_long_is_refused() -> None:
    with SimServers(time_scale=0.0, kv_cache_tokens=64) as s:
        page = httpx.get(f"{s.root_url}/metrics").text
        client = OpenAI(base_url=s.base_url, api_key="x", max_retries=0)
        with pytest.raises(BadRequestError, match=r"the prompt's 100 tokens exceed the KV cache \(64 tokens\)"):
            client.completions.create(model="m", prompt=" ".join(["w"] * 100), max_tokens=1)
        assert client.completions.create(model="m", prompt="short", max_tokens=2).choices[0].text
    assert 'num_gpu_blocks="4"' in page and 'block_size="16"' in page
    assert parse_reading(page) == ServerReading(
        running=0,
        waiting=0,
        kv_usage=0.0,
        kv_tokens=64,
        costs=ServerCosts(0.0, 0.0, tuple((bound, 0.0) for bound in (*TOKEN_GAP_BOUNDS, math.inf))),
    )


def test_what_the_llms_work_costs_is_reported_as_vllms_request_histograms() -> None:
    """Prefill seconds per computed token and seconds between tokens, as `ServerCosts` reads
    them from vLLM's `request_prefill_time`, `request_prefill_kv_computed_tokens` and
    `inter_token_latency` histograms, in the profile's seconds."""
    with SimServers(time_scale=0.0) as s:
        client = OpenAI(base_url=s.base_url, api_key="x")
        client.completions.create(model="m", prompt=" ".join(f"w{i}" for i in range(40)), max_tokens=5)
        reading = parse_reading(httpx.get(f"{s.root_url}/metrics").text)
    assert reading is not None and reading.costs is not None
    decode = LLM.latency("decode", 1)  # five steps of one sequence after one prefill step: four gaps
    bucket = min(bound for bound in TOKEN_GAP_BOUNDS if decode <= bound)
    assert reading.costs.prefill_tokens == 40 and (bucket, 4.0) in reading.costs.token_gaps
    assert reading.costs.prompt_token_s == pytest.approx(LLM.latency("prefill", 40) / 40)
    assert reading.costs.output_token_s is not None and reading.costs.output_token_s <= bucket


def test_a_chat_script_answers_with_tool_calls_where_tools_are_offered() -> None:
    def script(messages: Any) -> list[ScriptedToolCall] | None:
        last = messages[-1]
        return [ScriptedToolCall("lookup", {"key": last["content"]})] if last["role"] == "user" else None

    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    with SimServers(time_scale=0.0, chat_script=script) as s:
        client = OpenAI(base_url=s.base_url, api_key="x")
        first = client.chat.completions.create(model="m", messages=MESSAGES, tools=tools, max_tokens=4)
        (call,) = first.choices[0].message.tool_calls or []
        assert first.choices[0].finish_reason == "tool_calls"
        assert call.function.name == "lookup"
        assert json.loads(call.function.arguments) == {"key": MESSAGES[-1]["content"]}
        untooled = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        assert untooled.choices[0].message.tool_calls is None and untooled.choices[0].finish_reason == "stop"
        streamed = client.chat.completions.create(model="m", messages=MESSAGES, tools=tools, max_tokens=4, stream=True)
        deltas = [c.choices[0].delta.tool_calls for c in streamed if c.choices and c.choices[0].delta.tool_calls]
        assert [d[0].function.name for d in deltas] == ["lookup"]
