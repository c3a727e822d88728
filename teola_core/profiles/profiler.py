"""Measure an engine's latency curve: the median time of one `run` per batch size.

Profiles are what stage decomposition and topology-aware batching read to find an
engine's max efficient batch, so they should come from the engine itself rather than a
constant. The profiler sends batches of growing size and keeps the median of a few
repeats (a single slow run must not move the curve).

    async def embed_calls(n):
        return [Call("profile", embed_node, {"texts": texts[:n]})]

    profile = await profile_engine(engine, embed_calls, "embed", into=engine.profile, save_to="embedder.json")
    profile.max_efficient_batch("embed")

The curve's x is the `n` given to `make_calls`: items for embed/ingest/search/rerank
(one call of n items, or n calls of one, as the engine will see them), tokens for an
LLM's prefill, sequences for its decode (n one-token decodes, so one run is one step).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from teola_core.engines.protocol import Call, Engine
from teola_core.profiles.profile import Curve, LatencyProfile

Clock = Callable[[], float]
MakeCalls = Callable[[int], Sequence[Call] | Awaitable[Sequence[Call]]]


class ProfilingError(RuntimeError):
    """A call failed while profiling; the engine, operation and batch size are named."""


async def measure(engine: Engine, calls: Sequence[Call], clock: Clock = time.perf_counter) -> float:
    """Seconds one `engine.run(calls)` takes; a failed call raises (a failure is no latency)."""
    began = clock()
    results = await engine.run(calls)
    elapsed = clock() - began
    for call, result in zip(calls, results, strict=True):
        if isinstance(result, BaseException):
            raise ProfilingError(f"{engine.name}: {call.node.describe()} failed while profiling") from result
    return elapsed


async def profile_engine(
    engine: Engine,
    make_calls: MakeCalls,
    op: str,
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32),
    repeats: int = 3,
    clock: Clock = time.perf_counter,
    *,
    warmup: int = 1,
    into: LatencyProfile | None = None,
    save_to: str | Path | None = None,
) -> LatencyProfile:
    """Measure curve `op` of `engine` at each batch size; median of `repeats` runs each.

    `make_calls(n)` builds the calls of a batch of size n (it may be async: a decode
    needs a prefill first); it is called afresh for every run, so calls may hold
    per-run state. `warmup` untimed runs at the smallest size come first (lazy loading,
    caches). The result is `into` (default: the engine's own profile, if any) with the
    curve `op` replaced; `save_to` also writes it as JSON.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    sizes = sorted(set(batch_sizes))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch sizes must be positive integers, got {list(batch_sizes)}")

    async def calls_for(n: int) -> Sequence[Call]:
        made = make_calls(n)
        return await made if isinstance(made, Awaitable) else made

    for _ in range(warmup):
        await measure(engine, await calls_for(sizes[0]), clock)
    points = []
    for n in sizes:
        samples = [await measure(engine, await calls_for(n), clock) for _ in range(repeats)]
        points.append((n, statistics.median(samples)))

    base = into if into is not None else engine.profile
    curves = dict(base.curves) if base is not None else {}
    curves[op] = Curve(tuple(points))
    profile = LatencyProfile(base.engine if base is not None else engine.name, curves)
    if save_to is not None:
        profile.save(save_to)
    return profile
