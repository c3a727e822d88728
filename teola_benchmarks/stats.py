"""Latency statistics as the benchmarks report them."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100])."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(latencies: Sequence[float]) -> dict[str, float]:
    return {
        "mean_s": statistics.fmean(latencies),
        "p50_s": percentile(latencies, 50),
        "p99_s": percentile(latencies, 99),
    }
