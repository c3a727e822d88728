"""Orchestration overhead: primitive dispatches per second on zero-latency engines.

Engines answer instantly (time scale 0), so what is measured is Teola itself: graph
instantiation, the passes, both schedulers and the runtime's bookkeeping.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

from teola_adapters.simulated.paper_profiles import paper_engines
from teola_benchmarks.systems import SYSTEMS
from teola_benchmarks.workloads import Workload
from teola_core.passes import PassManager
from teola_core.passes.base import PassContext
from teola_core.runtime.base import PrimitiveSpan
from teola_core.runtime.local import LocalRuntime


@dataclass(frozen=True)
class OverheadResult:
    workload: str
    queries: int
    primitives: int
    seconds: float

    @property
    def dispatches_per_s(self) -> float:
        return self.primitives / self.seconds

    def to_json(self) -> dict[str, object]:
        return {
            "workload": self.workload,
            "queries": self.queries,
            "primitives": self.primitives,
            "seconds": self.seconds,
            "dispatches_per_s": self.dispatches_per_s,
        }


class _Count:
    def __init__(self) -> None:
        self.n = 0

    def on_span(self, span: PrimitiveSpan) -> None:
        self.n += 1


async def measure_overhead(workload: Workload, queries: int, concurrency: int = 32) -> OverheadResult:
    engines = paper_engines(time_scale=0.0, prefix_cache=True, responder=workload.model)
    runtime = LocalRuntime(engines, policy="topology")
    counter = _Count()
    runtime.add_hook(counter)
    manager = PassManager(SYSTEMS["teola"].pass_list())
    ctx = PassContext.of(engines)
    template = workload.template(0.0)
    prepared = [workload.make_query(i) for i in range(queries)]
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            graph = manager.optimize(template.instantiate(prepared[i]), ctx).e_graph
            await runtime.run(graph, prepared[i], query_id=f"q{i}")

    began = time.perf_counter()
    try:
        await asyncio.gather(*(one(i) for i in range(queries)))
    finally:
        await runtime.close()
        await engines.close()
    return OverheadResult(workload.name, queries, counter.n, time.perf_counter() - began)


def pin_to_one_core() -> None:
    """Measure on one core, as the claim is stated (Linux only; elsewhere a no-op)."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
