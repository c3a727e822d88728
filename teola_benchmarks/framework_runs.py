"""How the framework benchmarks (`--langchain`, `--langgraph`, `--llamaindex`) drive each system.

Every system runs in turn against the same simulated servers: a warm-up query (untimed),
the same query again alone on an emptied prefix cache (`alone_s`), then its measured run
on an emptied cache: a closed loop of `concurrency` workers, or an open loop whose
queries arrive at given times whatever the system's pace (`harness.open_loop`).

    latencies, outputs, alone = await measure_systems(
        {"plain": (app.ainvoke, lambda: closed_loop(app.ainvoke, inputs, 4))}, inputs[0], servers.root_url
    )
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import httpx

Ask = Callable[[Any], Awaitable[Any]]
"""One query to one system."""

Run = Callable[[], Awaitable[tuple[list[float], list[Any]]]]
"""A system's measured run: each query's latency and output, in input order."""


def check_sizes(queries: int, concurrency: int) -> None:
    """Refuse a run of no queries or no workers before any server starts."""
    if queries < 1 or concurrency < 1:
        raise ValueError("queries and concurrency must be >= 1")


async def measure_systems(
    systems: Mapping[str, tuple[Ask, Run]], warmup: Any, root_url: str
) -> tuple[dict[str, list[float]], dict[str, list[Any]], dict[str, float]]:
    """Latencies, outputs and `alone_s` of every system, run in turn (see the module docstring).

    The prefix cache of the servers at `root_url` is emptied before the alone query and before
    the measured run, so no system profits from the one before it.
    """
    latencies: dict[str, list[float]] = {}
    outputs: dict[str, list[Any]] = {}
    alone: dict[str, float] = {}
    async with httpx.AsyncClient() as admin:

        async def reset() -> None:
            (await admin.post(f"{root_url}/reset_prefix_cache")).raise_for_status()

        for name, (ask, run) in systems.items():
            await ask(warmup)  # connections, threads, the runtime: not timed
            await reset()
            began = time.perf_counter()
            await ask(warmup)  # again, alone, on a cold prefix cache: `alone_s`
            alone[name] = time.perf_counter() - began
            await reset()
            latencies[name], outputs[name] = await run()
    return latencies, outputs, alone


async def closed_loop(ask: Ask, inputs: Sequence[Any], concurrency: int) -> tuple[list[float], list[Any]]:
    """`concurrency` workers, each running the next query when its last one returned."""
    latencies = [0.0] * len(inputs)
    outputs: list[Any] = [None] * len(inputs)
    pending = iter(range(len(inputs)))

    async def worker() -> None:
        for i in pending:
            began = time.perf_counter()
            outputs[i] = await ask(inputs[i])
            latencies[i] = time.perf_counter() - began

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(inputs)))))
    return latencies, outputs


def alternating_rounds(runs: Mapping[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Each run's wall time in each of `rounds` rounds, the runs taking turns within a round
    so that every system sees the same machine state (zero-latency overhead measures)."""
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            began = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - began)
    return seconds
