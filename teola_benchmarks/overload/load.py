"""Load phases against a running `teola serve`, with aiohttp: closed loop, Poisson, a burst.

Every request is one chat completion to the served app, answered (200), refused (503),
past the client's deadline, or failed otherwise; a phase counts each, and the latencies
of the answers. Nothing is retried: the benchmark measures what the server does.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from teola_benchmarks.stats import percentile


@dataclass
class Phase:
    """What one phase's requests got. `window_s`: how long requests were sent."""

    name: str
    window_s: float = 0.0
    sent: int = 0
    answered: int = 0  # 200, within the deadline
    shed: int = 0  # 503 (with Retry-After)
    timed_out: int = 0  # the client's deadline passed
    other: dict[str, int] = field(default_factory=dict)  # other statuses and errors, by name
    latencies: list[float] = field(default_factory=list)

    @property
    def lost(self) -> int:
        """Requests neither answered nor refused with a 503."""
        return self.sent - self.answered - self.shed

    @property
    def goodput(self) -> float:
        return self.answered / self.window_s if self.window_s else 0.0

    def to_json(self) -> dict[str, Any]:
        ordered = sorted(self.latencies)
        return {
            "window_s": round(self.window_s, 3),
            "sent": self.sent,
            "answered": self.answered,
            "shed_503": self.shed,
            "timed_out": self.timed_out,
            "other": dict(self.other),
            "goodput_per_s": round(self.goodput, 1),
            "p50_s": round(percentile(ordered, 50), 4) if ordered else None,
            "p99_s": round(percentile(ordered, 99), 4) if ordered else None,
            "max_s": round(ordered[-1], 4) if ordered else None,
        }


class Client:
    """One aiohttp session to the server (unlimited connections, kept alive)."""

    def __init__(self, url: str, api_key: str, model: str) -> None:
        self.url = f"{url}/v1/chat/completions"
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.model = model
        self._n = 0
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def one(self, phase: Phase, deadline_s: float) -> None:
        self._n += 1
        body = {"model": self.model, "messages": [{"role": "user", "content": f"question number {self._n}"}]}
        phase.sent += 1
        began = time.perf_counter()
        try:
            timeout = aiohttp.ClientTimeout(total=deadline_s)
            async with self.session.post(self.url, json=body, headers=self.headers, timeout=timeout) as response:
                await response.read()
                status = response.status
        except TimeoutError:
            phase.timed_out += 1
            return
        except aiohttp.ClientError as exc:
            name = type(exc).__name__
            phase.other[name] = phase.other.get(name, 0) + 1
            return
        if status == 200:
            phase.answered += 1
            phase.latencies.append(time.perf_counter() - began)
        elif status == 503:
            phase.shed += 1
        else:
            phase.other[str(status)] = phase.other.get(str(status), 0) + 1

    async def close(self) -> None:
        await self.session.close()


async def closed_loop(client: Client, clients: int, seconds: float, deadline_s: float) -> Phase:
    """`clients` users, each sending its next request when the last one ends."""
    phase = Phase("closed loop")
    began = time.perf_counter()
    end = began + seconds

    async def user() -> None:
        while time.perf_counter() < end:
            await client.one(phase, deadline_s)

    await asyncio.gather(*(user() for _ in range(clients)))
    phase.window_s = time.perf_counter() - began
    return phase


async def poisson(client: Client, rate: float, seconds: float, deadline_s: float, seed: int, name: str) -> Phase:
    """Open loop: requests at Poisson arrivals of `rate` per second for `seconds`."""
    phase = Phase(name, window_s=seconds)
    rng = random.Random(seed)
    began = time.perf_counter()
    at = 0.0
    tasks: list[asyncio.Task[None]] = []
    while True:
        at += rng.expovariate(rate)
        if at >= seconds:
            break
        delay = began + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)  # a load generator waits for its arrival times
        tasks.append(asyncio.create_task(client.one(phase, deadline_s)))
    await asyncio.gather(*tasks)
    return phase


async def burst(client: Client, n: int, deadline_s: float) -> Phase:
    """`n` requests at once."""
    phase = Phase("burst")
    began = time.perf_counter()
    await asyncio.gather(*(client.one(phase, deadline_s) for _ in range(n)))
    phase.window_s = time.perf_counter() - began
    return phase
