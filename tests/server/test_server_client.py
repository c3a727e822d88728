"""The official openai client (sync, async, streaming) against a real server: same answers as the app."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from server_support import Served

QUESTIONS = ["what is teola", "why batch across requests", "how do cats sleep"]


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]


def test_models_and_health(served: Served) -> None:
    client = served.openai()
    assert sorted(m.id for m in client.models.list()) == sorted(served.apps)
    assert client.models.retrieve("chain").id == "chain"
    health = httpx.get(f"{served.url}/health").json()
    assert health == {"status": "ok"}  # model names are for holders of the key (/v1/models)


@pytest.mark.parametrize("question", QUESTIONS)
def test_sync_chat_equals_app(served: Served, question: str) -> None:
    expected = served.apps["chain"].invoke({"question": question})
    response = served.openai().chat.completions.create(model="chain", messages=user(question))
    assert response.choices[0].message.content == expected
    assert response.choices[0].finish_reason == "stop"
    assert response.model == "chain"
    usage = response.usage
    assert usage is not None
    assert usage.prompt_tokens == len(question.split())
    assert usage.completion_tokens == len(expected.split())
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_completions_equal_app(served: Served) -> None:
    expected = served.apps["chain"].invoke({"question": "a prompt"})
    response = served.openai().completions.create(model="chain", prompt="a prompt")
    assert response.choices[0].text == expected
    assert response.usage is not None and response.usage.completion_tokens == len(expected.split())


def test_root_input_app_gets_text_and_message_output(served: Served) -> None:
    expected = served.apps["raw"].invoke("plain text").text
    response = served.openai().chat.completions.create(model="raw", messages=user("plain text"))
    assert response.choices[0].message.content == expected


def test_several_variables_take_a_json_object(served: Served) -> None:
    value = {"context": "teola batches", "question": "what does it batch"}
    expected = served.apps["multi"].invoke(value)
    response = served.openai().chat.completions.create(
        model="multi", messages=[{"role": "user", "content": json.dumps(value)}]
    )
    assert response.choices[0].message.content == expected


def test_async_client_concurrent_equals_app(served: Served) -> None:
    async def main() -> list[str | None]:
        client = served.async_openai()
        try:
            responses = await asyncio.gather(
                *(client.chat.completions.create(model="chain", messages=user(q)) for q in QUESTIONS)
            )
        finally:
            await client.close()
        return [r.choices[0].message.content for r in responses]

    expected = [served.apps["chain"].invoke({"question": q}) for q in QUESTIONS]
    assert asyncio.run(main()) == expected


def test_sync_stream_equals_app_and_ends_with_usage(served: Served) -> None:
    expected = served.apps["chain"].invoke({"question": QUESTIONS[0]})
    stream = served.openai().chat.completions.create(
        model="chain", messages=user(QUESTIONS[0]), stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len([c for c in content if c]) > 1  # really streamed, not one chunk
    assert "".join(content) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(expected.split())
    assert all(c.object == "chat.completion.chunk" and c.model == "chain" for c in chunks)


def test_async_stream_completions_equals_app(served: Served) -> None:
    async def main() -> str:
        client = served.async_openai()
        try:
            stream = await client.completions.create(model="chain", prompt=QUESTIONS[1], stream=True)
            return "".join([c.choices[0].text async for c in stream])
        finally:
            await client.close()

    assert asyncio.run(main()) == served.apps["chain"].invoke({"question": QUESTIONS[1]})


def test_raw_sse_ends_with_done(served: Served) -> None:
    body = {"model": "chain", "messages": user("raw sse"), "stream": True}
    with httpx.stream(
        "POST", f"{served.url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer test-key"}
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"


def test_metrics_report_primitives_engines_queues(served: Served) -> None:
    served.openai().chat.completions.create(model="chain", messages=user("metrics please"))
    text = served.metrics()
    for needle in (
        'teola_primitive_latency_seconds_bucket{app="chain",kind=',
        'teola_engine_latency_seconds_count{app="chain",engine=',
        'teola_engine_batch_size_bucket{app="chain",engine=',
        'teola_engine_queue_depth{app="chain",engine=',
        'teola_engine_running_batches{app="chain",engine=',
        'teola_requests_total{endpoint="/v1/chat/completions",model="chain",status="200"}',
        "process_resident_memory_bytes",
    ):
        assert needle in text, needle
