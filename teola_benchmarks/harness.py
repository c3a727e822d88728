"""The benchmark harness: Poisson arrivals, every system on fresh engines, side by side.

    result = run_bench(WORKLOADS["advanced_rag"], rate=0.5, queries=40, seeds=(0, 1, 2, 3))
    result.summary("teola")["mean_s"], result.best_baseline(), result.to_json()

Each system gets fresh engines (same profiles, same fake model) and, per seed, the same
arrival times, so ratios are measured side by side. Latency is per query, from arrival
to answer. On the virtual clock (the default for simulated engines) only the engines'
modelled time passes: a run is exact, repeatable and immune to CPU load, and Teola's
own CPU time counts as zero (`teola bench --overhead` measures it). On the real clock
everything counts, including CPU contention, scaled by `1 / time_scale`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import statistics
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from graphlib import TopologicalSorter
from itertools import pairwise
from typing import Any

from teola_adapters.simulated.paper_profiles import paper_engines
from teola_adapters.simulated.virtual_time import run_virtual
from teola_benchmarks.stats import summarize
from teola_benchmarks.systems import SYSTEMS, System
from teola_benchmarks.workloads import Workload
from teola_benchmarks.workloads.common import FakeModel
from teola_core.engines.protocol import EngineSet
from teola_core.ir.graph import Graph
from teola_core.ir.speculation import speculation_of
from teola_core.passes import PassManager
from teola_core.passes.base import PassContext
from teola_core.profiles.profile import LatencyProfile
from teola_core.runtime.base import PrimitiveSpan
from teola_core.runtime.local import LocalRuntime

CLOCKS = ("virtual", "real")

EngineFactory = Callable[[float, bool, FakeModel], EngineSet]
"""(time scale, prefix cache on, the workload's fake model) -> fresh engines."""


def simulated_engines(
    time_scale: float, prefix_cache: bool, responder: FakeModel, profiles: Mapping[str, LatencyProfile] | None = None
) -> EngineSet:
    """The paper's engines; `profiles` (by engine name) replaces some of theirs (a what-if run)."""
    return paper_engines(time_scale=time_scale, prefix_cache=prefix_cache, responder=responder, profiles=profiles)


@dataclass
class SystemResult:
    latencies: list[float]
    outputs: list[dict[str, object]]

    def summary(self) -> dict[str, float]:
        return summarize(self.latencies)


@dataclass
class BenchResult:
    """One workload at one rate: every system's run for each seed (arrival sequence)."""

    workload: str
    rate: float
    queries: int
    critical_path_s: float
    clock: str = "virtual"
    runs: dict[int, dict[str, SystemResult]] = field(default_factory=dict)  # seed -> system -> run
    busiest: Busiest | None = None  # the single-instance engine with the most work per query
    arrivals: dict[int, list[float]] = field(default_factory=dict)  # seed -> arrival times

    @property
    def seeds(self) -> list[int]:
        return list(self.runs)

    @property
    def systems(self) -> list[str]:
        return list(next(iter(self.runs.values()), {}))

    def summary(self, system: str) -> dict[str, float]:
        """Mean, p50 and p99 over every seed's queries together."""
        return summarize([x for runs in self.runs.values() for x in runs[system].latencies])

    def by_seed(self, system: str) -> dict[int, dict[str, float]]:
        return {seed: runs[system].summary() for seed, runs in self.runs.items()}

    def queueing_bound_s(self) -> float | None:
        """A lower bound on any system's mean latency, from the busiest single-instance engine.

        A query's work there (`work_s`, its least: one batch) cannot start before it
        arrives, and after the engine's last piece of it the query still needs `post_s`
        (the rest of its critical path). For equal jobs on one server every
        work-conserving order gives the same sum of completion times, first come first
        served among them, so no system's mean is below max(critical path, mean wait +
        work + post), the wait that of a FCFS queue of `work_s` per arrival.
        """
        if self.busiest is None:
            return None
        b = self.busiest
        waits = [wait for times in self.arrivals.values() for wait in lindley_waits(times, b.work_s)]
        return max(self.critical_path_s, statistics.fmean(waits) + b.work_s + b.post_s) if waits else None

    def best_baseline(self) -> str | None:
        """The system other than Teola with the lowest mean latency (modern or paper; on a tie,
        equal to float rounding, today's before the paper's)."""
        others = [name for name in self.systems if name != "teola"]
        return min(others, key=lambda name: (round(self.summary(name)["mean_s"], 9), SYSTEMS[name].paper), default=None)

    def to_json(self) -> dict[str, Any]:
        systems: dict[str, Any] = {}
        for name in self.systems:
            per_seed = self.by_seed(name)
            means = [s["mean_s"] for s in per_seed.values()]
            systems[name] = {
                **self.summary(name),
                "paper": SYSTEMS[name].paper,
                "mean_s_range": [min(means), max(means)],
                "by_seed": {str(seed): s for seed, s in per_seed.items()},
            }
        return {
            "workload": self.workload,
            "rate": self.rate,
            "queries": self.queries,
            "seeds": self.seeds,
            "clock": self.clock,
            "critical_path_s": self.critical_path_s,
            "best_baseline": self.best_baseline(),
            "queueing_bound": None
            if self.busiest is None
            else {**dataclasses.asdict(self.busiest), "mean_s": self.queueing_bound_s()},
            "systems": systems,
        }


def arrival_times(rate: float, n: int, seed: int) -> list[float]:
    """Poisson process: exponential gaps with mean 1/rate (unscaled seconds)."""
    rng = random.Random(seed)
    t, times = 0.0, []
    for _ in range(n):
        times.append(t)
        t += rng.expovariate(rate)
    return times


async def open_loop(
    ask: Callable[[Any], Awaitable[Any]], inputs: Sequence[Any], arrivals: Sequence[float]
) -> tuple[list[float], list[Any]]:
    """Query `i` starts `arrivals[i]` seconds after the first, whether or not earlier ones
    returned (users do not wait for each other); its latency counts from its arrival."""
    if len(arrivals) != len(inputs):
        raise ValueError(f"{len(inputs)} inputs but {len(arrivals)} arrival times")
    loop = asyncio.get_running_loop()
    start = loop.time()
    latencies = [0.0] * len(inputs)
    outputs: list[Any] = [None] * len(inputs)

    async def one(i: int) -> None:
        await asyncio.sleep(max(0.0, start + arrivals[i] - loop.time()))
        began = loop.time()  # the loop's clock: real, or virtual
        outputs[i] = await ask(inputs[i])
        latencies[i] = loop.time() - began

    await asyncio.gather(*(one(i) for i in range(len(inputs))))
    return latencies, outputs


def lindley_waits(arrivals: Sequence[float], work: float) -> list[float]:
    """Each arrival's wait in a first-come-first-served queue of `work` seconds per job."""
    waits, free = [], 0.0
    for at in arrivals:
        waits.append(max(0.0, free - at))
        free = max(free, at) + work
    return waits


@dataclass(frozen=True)
class Busiest:
    """The busiest single-instance engine: a query's least work there, and what follows it."""

    engine: str
    work_s: float  # each op's items of one query in one batch, by the profile
    post_s: float  # from the engine's last span of the query to its answer, on the critical path


def busiest_engine(graph: Graph, engines: EngineSet, ran: set[str] | None = None) -> tuple[str, float] | None:
    """The single-instance engine with the most profiled work for one query's graph, and that
    work as if each op's items ran in one batch (the least it can take). `ran`: count only
    these nodes (those a run dispatched: a branch not taken is no work). Speculative nodes
    are not counted: a busy engine gives them up, so no query needs them."""
    items: dict[tuple[str, str], int] = {}
    for node in graph.nodes.values():
        if (ran is not None and node.id not in ran) or speculation_of(node) is not None:
            continue
        engine = engines.engines.get(node.engine) if node.engine is not None else None
        if engine is None or engine.profile is None or engine.limits.concurrency != 1:
            continue
        if node.kind.value in engine.profile.curves:
            key = (node.engine, node.kind.value)
            items[key] = items.get(key, 0) + (node.items or 1)
    work: dict[str, float] = {}
    for (name, op), n in items.items():
        work[name] = work.get(name, 0.0) + engines[name].profile.latency(op, n)  # type: ignore[union-attr]
    return max(work.items(), key=lambda kv: kv[1], default=None)


class _Spans:
    def __init__(self) -> None:
        self.spans: list[PrimitiveSpan] = []

    def on_span(self, span: PrimitiveSpan) -> None:
        self.spans.append(span)


def _pass_context(engines: EngineSet, planned_profiles: Mapping[str, LatencyProfile] | None) -> PassContext:
    """What the passes see of the engines, with `planned_profiles` in place of their own."""
    ctx = PassContext.of(engines)
    return dataclasses.replace(ctx, profiles={**ctx.profiles, **planned_profiles}) if planned_profiles else ctx


def _runtime(engines: EngineSet, system: System) -> LocalRuntime:
    return LocalRuntime(
        engines, policy=system.policy, max_batch=system.max_batch(), clock=asyncio.get_running_loop().time
    )


async def run_system(
    workload: Workload,
    system: System,
    arrivals: Sequence[float],
    time_scale: float,
    make_engines: EngineFactory = simulated_engines,
    planned_profiles: Mapping[str, LatencyProfile] | None = None,
) -> SystemResult:
    """Run every query of the sequence on a fresh runtime configured as `system`; the
    passes plan with `planned_profiles` (by engine) in place of those engines' own."""
    engines = make_engines(time_scale, system.prefix_cache, workload.model)
    runtime = _runtime(engines, system)
    manager = PassManager(system.pass_list())
    ctx = _pass_context(engines, planned_profiles)
    template = workload.template(time_scale)

    async def ask(i: int) -> dict[str, object]:
        query = workload.make_query(i)
        graph = manager.optimize(template.instantiate(query), ctx).e_graph
        return await runtime.run(graph, query, query_id=f"q{i}")

    try:
        latencies, outputs = await open_loop(ask, range(len(arrivals)), [at * time_scale for at in arrivals])
    finally:
        await runtime.close()
        await engines.close()
    return SystemResult([s / time_scale for s in latencies], outputs)


async def critical_path(
    workload: Workload,
    time_scale: float,
    query_index: int = 0,
    make_engines: EngineFactory = simulated_engines,
    planned_profiles: Mapping[str, LatencyProfile] | None = None,
) -> tuple[float, Busiest | None]:
    """The e-graph's critical-path lower bound for one query, in unscaled seconds.

    The query runs alone on Teola's configuration, after one other query (so the prompt
    prefixes every query shares are cached, as in any steady run); each primitive's
    service time (its span from start to end) weighs its node. Besides the graph's edges, primitives that
    ran one after another on a single-instance engine are ordered too (stages of one
    split share the embedder), so the bound respects the engines the run had; it leaves
    out only waiting and dispatch gaps. Also the busiest single-instance engine of that
    graph (`busiest_engine`) and what follows its last span of the query, unscaled.
    """
    system = SYSTEMS["teola"]
    engines = make_engines(time_scale, True, workload.model)
    runtime = _runtime(engines, system)
    manager = PassManager(system.pass_list())
    ctx = _pass_context(engines, planned_profiles)

    def graph_of(query: Mapping[str, Any]) -> Graph:
        return manager.optimize(workload.template(time_scale).instantiate(query), ctx).e_graph

    spans = _Spans()
    warm, query = workload.make_query(query_index + 1), workload.make_query(query_index)
    graph = graph_of(query)
    try:
        await runtime.run(graph_of(warm), warm, query_id="warm-up")  # prompt prefixes all queries share, cached
        runtime.add_hook(spans)
        began = runtime.now()
        await runtime.run(graph, query, query_id="critical")
    finally:
        await runtime.close()
        await engines.close()
    cp = longest_path(graph, spans.spans, engines) / time_scale
    found = busiest_engine(graph, engines, ran={s.node.id for s in spans.spans})
    if found is None:
        return cp, None
    last = max((s.ended_at for s in spans.spans if s.node.engine == found[0]), default=began)
    return cp, Busiest(found[0], found[1], max(0.0, cp - (last - began) / time_scale))


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
    time_scale: float = 1.0,
    systems: Sequence[str] = tuple(SYSTEMS),
    seeds: Sequence[int] = (0,),
    clock: str = "virtual",
    make_engines: EngineFactory = simulated_engines,
    on_system: Callable[[str], None] | None = None,
    planned_profiles: Mapping[str, LatencyProfile] | None = None,
) -> BenchResult:
    """Every system on every seed's arrivals, on the running loop (`clock` only labels it);
    `on_system(name)` after each system's run (a progress display); `planned_profiles`: what
    the passes plan with where it differs from the engines (see `run_system`)."""
    cp, busiest = await critical_path(
        workload, time_scale, make_engines=make_engines, planned_profiles=planned_profiles
    )
    result = BenchResult(workload.name, rate, queries, cp, clock, busiest=busiest)
    for seed in seeds:
        arrivals = result.arrivals[seed] = arrival_times(rate, queries, seed)
        runs = result.runs[seed] = {}
        for name in systems:
            runs[name] = await run_system(workload, SYSTEMS[name], arrivals, time_scale, make_engines, planned_profiles)
            if on_system is not None:
                on_system(name)
        reference = runs[systems[0]].outputs
        for name, r in runs.items():
            if r.outputs != reference:
                raise AssertionError(f"system {name!r} returned different answers than {systems[0]!r}")
    return result


def run_bench(workload: Workload, *, clock: str = "virtual", time_scale: float = 1.0, **options: Any) -> BenchResult:
    """`bench` on a fresh event loop: virtual (exact, time scale 1) or real."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
    if clock == "virtual":
        if time_scale != 1.0:
            raise ValueError("the virtual clock needs no time scale: it must be 1")
        return run_virtual(bench(workload, clock=clock, time_scale=1.0, **options))
    return asyncio.run(bench(workload, clock=clock, time_scale=time_scale, **options))


def speedups(result: BenchResult, stat: str = "mean_s") -> dict[str, float]:
    """Each baseline's `stat` over Teola's (> 1: Teola is faster)."""
    teola = result.summary("teola")[stat]
    return {name: result.summary(name)[stat] / teola for name in result.systems if name != "teola"}
