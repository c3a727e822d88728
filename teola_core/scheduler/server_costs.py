"""What a model server's work costs it, from its own request histograms in `/metrics`.

vLLM reports, per finished request, the seconds from its scheduling to its first token
(`vllm:request_prefill_time_seconds`) and the prompt tokens it computed for it, the
prefix cache's aside (`vllm:request_prefill_kv_computed_tokens`), and every gap between
two of a request's tokens (`vllm:inter_token_latency_seconds`). The first two's sums give
the prefill seconds per computed prompt token; the gaps' median gives the seconds a
written token takes. The median, not the mean: a step that also computes a prompt
stretches the gaps of every sequence in it (on a CPU server to seconds), and that is a
cost of prefill, already counted; most steps only write. Both are measured under the
server's own load: on a GPU a prompt token costs a small share of a decode step, on a
CPU a large one. Teola reads them where a choice depends on that ratio (which admission
order pays).

    costs = ServerCosts(prefill_s=2.0, prefill_tokens=25_000, token_gaps=((0.01, 0), (0.025, 900), (inf, 1000)))
    costs.prompt_token_s, costs.output_token_s     # 8e-05, 0.0183...
Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PREFILL_TIME = "vllm:request_prefill_time_seconds"
PREFILL_COMPUTED = "vllm:request_prefill_kv_computed_tokens"
TOKEN_GAPS = "vllm:inter_token_latency_seconds"
COST_SUMS = (f"{PREFILL_TIME}_sum", f"{PREFILL_COMPUTED}_sum")
TOKEN_GAP_BUCKETS = f"{TOKEN_GAPS}_bucket"
# vLLM's bucket bounds for inter-token latency (seconds; +Inf beyond the last)
TOKEN_GAP_BOUNDS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)


@dataclass(frozen=True, slots=True)
class ServerCosts:
    """A server's request histograms since it started (see the module docstring)."""

    prefill_s: float  # seconds from scheduling to first token, summed over finished requests
    prefill_tokens: float  # prompt tokens those requests computed (cached ones aside)
    token_gaps: tuple[tuple[float, float], ...]  # (upper bound, cumulative count) per bucket, +Inf last

    @classmethod
    def from_series(cls, sums: Mapping[str, float], gap_buckets: Mapping[float, float]) -> ServerCosts | None:
        """From the sums (`series name -> value`) and the gap histogram's buckets (`bound ->
        cumulative count`), each summed over the model's labels; None if one is missing."""
        if not all(name in sums for name in COST_SUMS) or math.inf not in gap_buckets:
            return None
        return cls(sums[f"{PREFILL_TIME}_sum"], sums[f"{PREFILL_COMPUTED}_sum"], tuple(sorted(gap_buckets.items())))

    @property
    def prompt_token_s(self) -> float | None:
        """Seconds of prefill per computed prompt token (None before any was computed)."""
        return self.prefill_s / self.prefill_tokens if self.prefill_tokens > 0 else None

    @property
    def output_token_s(self) -> float | None:
        """The median gap between a request's tokens (None before any gap was seen)."""
        return median_of_buckets(self.token_gaps)


def median_of_buckets(buckets: Sequence[tuple[float, float]]) -> float | None:
    """A cumulative histogram's median, linear within its bucket as Prometheus's
    `histogram_quantile` takes it (the last finite bound if it falls in +Inf; None without
    observations or without a finite bound)."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0 or not any(math.isfinite(bound) for bound, _ in buckets):
        return None
    rank = total / 2
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:  # below < rank <= count: the median falls in this bucket
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower
