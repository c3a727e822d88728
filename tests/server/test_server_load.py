"""Client disconnects cancel their query; a bounded load test on loopback."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import openai
import pytest
from server_support import Served

N_REQUESTS, N_CLIENTS = 200, 32
RSS_GROWTH_BOUND = 64 << 20


def rss(served: Served) -> float:
    """The server process's resident memory, from its own /metrics."""
    text = served.metrics()
    match = re.search(r"^process_resident_memory_bytes ([0-9.e+]+)$", text, re.M)
    assert match is not None
    return float(match.group(1))


def in_progress(served: Served) -> float:
    text = served.metrics()
    return sum(float(v) for v in re.findall(r"^teola_requests_in_progress\{[^}]*\} ([0-9.e+-]+)$", text, re.M))


@pytest.fixture
def blocking(served: Served) -> Served:
    served.started.clear()
    served.cancelled.clear()
    return served


def test_disconnect_mid_request_cancels_query(blocking: Served) -> None:
    client = blocking.openai(timeout=1.0)
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model="blocking", messages=[{"role": "user", "content": "wait"}])
    assert blocking.started.is_set()
    assert blocking.cancelled.wait(10), "the query was not cancelled when its client left"
    assert blocking.openai().chat.completions.create(model="chain", messages=[{"role": "user", "content": "next"}])


def test_disconnect_mid_stream_cancels_query(blocking: Served) -> None:
    stream = blocking.openai().chat.completions.create(
        model="blocking", messages=[{"role": "user", "content": "wait"}], stream=True
    )
    seen = ""
    for chunk in stream:
        seen += chunk.choices[0].delta.content or ""
        if seen:
            break
    assert seen == "hello"
    stream.close()
    assert blocking.cancelled.wait(10), "the streaming query was not cancelled when its client left"


async def _load(served: Served, *, stream: bool, leave_every: int | None) -> tuple[list[float], int, list[str]]:
    """N_REQUESTS chat requests from N_CLIENTS concurrent clients; returns latencies, left, errors."""
    client = served.async_openai(timeout=30.0, max_retries=2)  # as clients are: a 503 is retried
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(N_REQUESTS):
        queue.put_nowait(i)
    answers = [served.apps["chain"].invoke({"question": f"load question number {i}"}) for i in range(N_REQUESTS)]
    latencies: list[float] = []
    errors: list[str] = []
    left = 0

    async def one(i: int) -> None:
        nonlocal left
        question = f"load question number {i}"
        expected = answers[i]
        messages = [{"role": "user", "content": question}]
        start = time.perf_counter()
        if not stream:
            response = await client.chat.completions.create(model="chain", messages=messages)
            got = response.choices[0].message.content
        else:
            chunks = await client.chat.completions.create(model="chain", messages=messages, stream=True)
            got = ""
            async for chunk in chunks:
                got += (chunk.choices[0].delta.content or "") if chunk.choices else ""
                if leave_every and i % leave_every == 0 and got:
                    await chunks.close()
                    left += 1
                    return
        latencies.append(time.perf_counter() - start)
        if got != expected:
            errors.append(f"request {i}: {got!r} != {expected!r}")

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            try:
                await one(i)
            except Exception as exc:
                errors.append(f"request {i}: {type(exc).__name__}: {exc}")

    try:
        await asyncio.gather(*(worker() for _ in range(N_CLIENTS)))
    finally:
        await client.close()
    return latencies, left, errors


def _report(name: str, latencies: list[float], wall: float) -> None:
    ordered = sorted(latencies)
    p50, p99 = ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    print(
        f"\n{name}: {len(ordered)} ok in {wall:.2f}s ({len(ordered) / wall:.0f} req/s), "
        f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms"
    )


@pytest.mark.parametrize(("stream", "leave_every"), [(False, None), (True, 10)], ids=["invoke", "stream-10pct-leave"])
def test_load(served: Served, stream: bool, leave_every: int | None) -> None:
    asyncio.run(_load(served, stream=stream, leave_every=None))  # warm-up (imports, caches)
    before = rss(served)
    start = time.perf_counter()
    latencies, left, errors = asyncio.run(_load(served, stream=stream, leave_every=leave_every))
    wall = time.perf_counter() - start
    after = rss(served)
    _report(f"load {stream=} {leave_every=}", latencies, wall)
    print(f"RSS before {before / 2**20:.1f} MiB, after {after / 2**20:.1f} MiB")
    assert errors == []
    expected_left = len(range(0, N_REQUESTS, leave_every)) if leave_every else 0
    assert left == expected_left
    assert len(latencies) == N_REQUESTS - expected_left  # no request lost
    assert after - before < RSS_GROWTH_BOUND
    assert httpx.get(f"{served.url}/health").status_code == 200
