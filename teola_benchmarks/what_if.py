"""What if one engine op were cheaper? The most any optimization of that op could win.

A pass that takes work off one op (rerank pipelined into search, so that only the last
search's new candidates are scored on the critical path; a cache that skips repeated
embeddings) can at most make that op's time go away. Running Teola on the same arrivals
with that op's latency curve scaled by a factor (0: free), and the baselines as they
are, bounds what any such pass can win before anyone builds it: a target above the
bound is out of reach for that pass, and the bound says which op is worth the work.

    change = OpChange.parse("reranker.rerank=0.33")
    found = what_if(result, WORKLOADS["advanced_rag"], change)   # result: run_bench's
    found.vs_best("mean_s")                                      # best baseline / Teola changed

The scaled curve is seen by everything Teola runs on: its passes (through the
profiles), its engine's batches and the queue behind them. Simulated engines only.

The same change as a stale profile (`misprofiled`, `teola bench --misprofiled`): every
system runs on the changed engines while Teola's passes plan with the old profile, which
shows what a wrong profile costs a plan (rerank pre-scoring planned with a reranker
faster than the one it gets).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from teola_adapters.simulated.paper_profiles import paper_profiles
from teola_adapters.simulated.virtual_time import run_virtual
from teola_benchmarks.harness import BenchResult, EngineFactory, bench, simulated_engines
from teola_benchmarks.workloads import Workload
from teola_benchmarks.workloads.common import FakeModel
from teola_core.engines.protocol import EngineSet
from teola_core.profiles.profile import LatencyProfile


@dataclass(frozen=True)
class OpChange:
    """One engine op's latency curve scaled by `factor` ("reranker.rerank=0.33")."""

    engine: str
    op: str
    factor: float

    @classmethod
    def parse(cls, text: str) -> OpChange:
        """`ENGINE.OP=FACTOR` of the paper engines; a bad one raises ValueError naming what is known."""
        target, sep, number = text.partition("=")
        engine, dot, op = target.strip().partition(".")
        if not sep or not dot:
            raise ValueError(f"{text!r}: expected ENGINE.OP=FACTOR, e.g. reranker.rerank=0.5")
        profiles = paper_profiles()
        if engine not in profiles:
            raise ValueError(f"{text!r}: no engine {engine!r} (known: {', '.join(sorted(profiles))})")
        if op not in profiles[engine].curves:
            known = ", ".join(sorted(profiles[engine].curves))
            raise ValueError(f"{text!r}: engine {engine!r} has no op {op!r} (known: {known})")
        try:
            factor = float(number)
        except ValueError:
            raise ValueError(f"{text!r}: the factor {number.strip()!r} is not a number") from None
        if not factor >= 0:
            raise ValueError(f"{text!r}: the factor must be >= 0 (0: the op is free)")
        return cls(engine, op, factor)

    def __str__(self) -> str:
        return f"{self.engine}.{self.op}={self.factor:g}"

    def check(self, workload: Workload) -> None:
        """ValueError if the workload never runs this op (the change would change nothing)."""
        graph = workload.template(1.0).instantiate(workload.make_query(0))
        if not any(n.engine == self.engine and n.kind.value == self.op for n in graph.nodes.values()):
            raise ValueError(f"{self}: workload {workload.name!r} runs no {self.op} on {self.engine!r}")

    def engines(self) -> EngineFactory:
        """A factory of the paper's engines with this op's curve scaled."""
        return scaled_engines([self])


def scaled_engines(changes: Sequence[OpChange]) -> EngineFactory:
    """A factory of the paper's engines with every change's op curve scaled (changes to one
    engine compose)."""
    profiles = dict(paper_profiles())
    for change in changes:
        profiles[change.engine] = profiles[change.engine].with_op_scaled(change.op, change.factor)
    changed = {c.engine: profiles[c.engine] for c in changes}

    def make(time_scale: float, prefix_cache: bool, responder: FakeModel) -> EngineSet:
        return simulated_engines(time_scale, prefix_cache, responder, profiles=changed)

    return make


def misprofiled(changes: Sequence[OpChange]) -> tuple[EngineFactory, dict[str, LatencyProfile]]:
    """Engines whose ops run as `changes` say, and the profiles the passes then plan with: the
    engines' unchanged ones (a profile measured before the engine got slower or faster).
    Every system runs on these engines: what a stale profile costs Teola's plan."""
    return scaled_engines(changes), {c.engine: paper_profiles()[c.engine] for c in changes}


@dataclass(frozen=True)
class WhatIf:
    """Teola with one op changed (`changed`, a run of Teola alone) against `base`, the
    unchanged run of every system on the same arrivals."""

    change: OpChange
    base: BenchResult
    changed: BenchResult

    def vs_best(self, stat: str = "mean_s") -> float | None:
        """The best unchanged baseline's `stat` over changed Teola's (> 1: Teola faster)."""
        best = self.base.best_baseline()
        if best is None:
            return None
        return self.base.summary(best)[stat] / self.changed.summary("teola")[stat]

    def to_json(self) -> dict[str, Any]:
        bound = self.changed.queueing_bound_s()
        return {
            "change": str(self.change),
            "critical_path_s": self.changed.critical_path_s,
            "queueing_bound_s": bound,
            "teola": self.changed.summary("teola"),
            "best_baseline": self.base.best_baseline(),
            "vs_best": {"mean": self.vs_best("mean_s"), "p99": self.vs_best("p99_s")},
        }


def what_if(base: BenchResult, workload: Workload, change: OpChange) -> WhatIf:
    """Teola on `base`'s arrivals (same rate, queries, seeds) with `change`, on the virtual clock."""
    if base.clock != "virtual":
        raise ValueError("a what-if run compares exact runs: the base must be on the virtual clock")
    change.check(workload)
    changed = run_virtual(
        bench(
            workload,
            rate=base.rate,
            queries=base.queries,
            systems=("teola",),
            seeds=base.seeds,
            make_engines=change.engines(),
        )
    )
    return WhatIf(change, base, changed)
