"""The benchmark harness: Poisson arrivals, every system on fresh engines, one run.

Each system gets its own fresh simulated engines (same profiles, same fake model) and
the same query sequence with the same arrival times, so the ratios between systems are
measured side by side. Latency is end to end per query, from its arrival to its
answer, including Teola's own graph building and passes, reported in unscaled seconds.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from graphlib import TopologicalSorter
from itertools import pairwise

from teola_adapters.simulated.paper_profiles import paper_engines
from teola_benchmarks.stats import summarize
from teola_benchmarks.systems import SYSTEMS, System
from teola_benchmarks.workloads import Workload
from teola_benchmarks.workloads.common import FakeModel
from teola_core.engines.protocol import EngineSet
from teola_core.ir.graph import Graph
from teola_core.passes import PassManager
from teola_core.passes.base import PassContext
from teola_core.runtime.base import PrimitiveSpan
from teola_core.runtime.local import LocalRuntime


@dataclass
class SystemResult:
    latencies: list[float]
    outputs: list[dict[str, object]]

    def summary(self) -> dict[str, float]:
        return summarize(self.latencies)


@dataclass
class BenchResult:
    workload: str
    rate: float
    queries: int
    critical_path_s: float
    seed: int = 0
    systems: dict[str, SystemResult] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "workload": self.workload,
            "rate": self.rate,
            "queries": self.queries,
            "critical_path_s": self.critical_path_s,
            "systems": {name: r.summary() for name, r in self.systems.items()},
        }


def arrival_times(rate: float, n: int, seed: int) -> list[float]:
    """Poisson process: exponential gaps with mean 1/rate (unscaled seconds)."""
    rng = random.Random(seed)
    t, times = 0.0, []
    for _ in range(n):
        times.append(t)
        t += rng.expovariate(rate)
    return times


class _Spans:
    def __init__(self) -> None:
        self.spans: list[PrimitiveSpan] = []

    def on_span(self, span: PrimitiveSpan) -> None:
        self.spans.append(span)


EngineFactory = Callable[[float, bool, FakeModel], EngineSet]
"""(time scale, prefix cache on, the workload's fake model) -> fresh engines."""


def simulated_engines(time_scale: float, prefix_cache: bool, responder: FakeModel) -> EngineSet:
    return paper_engines(time_scale=time_scale, prefix_cache=prefix_cache, responder=responder)


async def run_system(
    workload: Workload,
    system: System,
    arrivals: Sequence[float],
    time_scale: float,
    make_engines: EngineFactory = simulated_engines,
) -> SystemResult:
    """Run every query of the sequence on a fresh runtime configured as `system`."""
    engines = make_engines(time_scale, system.prefix_cache, workload.model)
    runtime = LocalRuntime(engines, policy=system.policy, max_batch=system.max_batch())
    manager = PassManager(system.pass_list())
    ctx = PassContext(profiles=engines.profiles())
    template = workload.template(time_scale)
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(i: int, at: float) -> tuple[float, dict[str, object]]:
        await asyncio.sleep(max(0.0, start + at * time_scale - loop.time()))
        began = time.perf_counter()
        query = workload.make_query(i)
        graph = manager.optimize(template.instantiate(query), ctx).e_graph
        outputs = await runtime.run(graph, query, query_id=f"q{i}")
        return (time.perf_counter() - began) / time_scale, outputs

    try:
        results = await asyncio.gather(*(one(i, at) for i, at in enumerate(arrivals)))
    finally:
        await runtime.close()
        await engines.close()
    return SystemResult([r[0] for r in results], [r[1] for r in results])


async def critical_path(
    workload: Workload, time_scale: float, query_index: int = 0, make_engines: EngineFactory = simulated_engines
) -> float:
    """The e-graph's critical-path lower bound for one query, in unscaled seconds.

    The query runs alone on Teola's configuration; each primitive's service time (its
    span from start to end) weighs its node. Besides the graph's edges, primitives that
    ran one after another on a single-instance engine are ordered too (stages of one
    split share the embedder), so the bound respects the engines the run had; it leaves
    out only waiting and dispatch gaps.
    """
    system = SYSTEMS["teola"]
    engines = make_engines(time_scale, True, workload.model)
    runtime = LocalRuntime(engines, policy=system.policy)
    spans = _Spans()
    runtime.add_hook(spans)
    query = workload.make_query(query_index)
    graph: Graph = (
        PassManager(system.pass_list())
        .optimize(workload.template(time_scale).instantiate(query), PassContext(profiles=engines.profiles()))
        .e_graph
    )
    try:
        await runtime.run(graph, query, query_id="critical")
    finally:
        await runtime.close()
        await engines.close()
    return longest_path(graph, spans.spans, engines) / time_scale


def longest_path(graph: Graph, spans: Sequence[PrimitiveSpan], engines: EngineSet) -> float:
    """Longest service-time path through the graph plus single-instance engine order."""
    service = {s.node.id: s.ended_at - s.started_at for s in spans}
    after: dict[str, set[str]] = {node_id: graph.predecessors(node_id) for node_id in graph.nodes}
    by_engine: dict[str, list[PrimitiveSpan]] = {}
    for s in spans:
        if s.node.engine is not None and engines[s.node.engine].limits.concurrency == 1:
            by_engine.setdefault(s.node.engine, []).append(s)
    for runs in by_engine.values():
        runs.sort(key=lambda s: s.started_at)
        for first, then in pairwise(runs):
            if then.started_at >= first.ended_at:
                after[then.node.id].add(first.node.id)
    finish: dict[str, float] = {}
    for node_id in TopologicalSorter(after).static_order():
        finish[node_id] = service.get(node_id, 0.0) + max((finish[p] for p in after[node_id]), default=0.0)
    return max(finish.values())


async def bench(
    workload: Workload,
    *,
    rate: float,
    queries: int,
    time_scale: float,
    systems: Sequence[str] = tuple(SYSTEMS),
    seed: int = 0,
    make_engines: EngineFactory = simulated_engines,
    on_system: Callable[[str], None] | None = None,
) -> BenchResult:
    """Every system on the same arrivals; `on_system(name)` after each (a progress display)."""
    arrivals = arrival_times(rate, queries, seed)
    cp = await critical_path(workload, time_scale, make_engines=make_engines)
    result = BenchResult(workload.name, rate, queries, cp, seed)
    for name in systems:
        result.systems[name] = await run_system(workload, SYSTEMS[name], arrivals, time_scale, make_engines)
        if on_system is not None:
            on_system(name)
    reference = next(iter(result.systems.values())).outputs
    for name, r in result.systems.items():
        if r.outputs != reference:
            raise AssertionError(f"system {name!r} returned different answers than {systems[0]!r}")
    return result
