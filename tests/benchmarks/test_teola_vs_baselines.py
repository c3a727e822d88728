"""Regression: on the virtual clock, Teola's mean latency is never above any baseline's.

Every workload, seeds 0-3, 0.5 q/s, 40 queries, all seven systems: a change to a pass,
a policy or the runtime that makes Teola lose to a baseline fails here. The run is exact
(virtual time), so the comparison has no noise to allow for beyond float rounding
(identical schedules reached by different paths differ by ~1e-13 s).
"""

from __future__ import annotations

import pytest

from teola_benchmarks.harness import run_bench
from teola_benchmarks.systems import BASELINES
from teola_benchmarks.workloads import WORKLOADS


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_teola_mean_is_at_most_every_baselines_on_every_seed(name: str) -> None:
    result = run_bench(WORKLOADS[name], rate=0.5, queries=40, seeds=(0, 1, 2, 3))
    teola = result.by_seed("teola")
    slower = [
        f"{baseline} seed {seed}: {stats['mean_s']:.3f} s < teola {teola[seed]['mean_s']:.3f} s"
        for baseline in BASELINES
        for seed, stats in result.by_seed(baseline).items()
        if teola[seed]["mean_s"] > stats["mean_s"] + 1e-9  # equal schedules differ by float rounding only
    ]
    assert not slower, f"{name}: Teola is slower than " + "; ".join(slower)
