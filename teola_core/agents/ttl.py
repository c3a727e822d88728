"""How long to hold an agent's KV while its tool runs (Continuum's time-to-live rule).

Holding the KV of an agent that waits on a tool saves, if the tool returns in time, the
re-prefill of its context and the queueing an evicted program sees when it comes back;
it costs the memory other agents could use for as long as it is held. Continuum picks

    tau* = argmax over tau in {0} ∪ {observed durations} of  F(tau) * (T * eta + Reload) - tau

where F is the empirical CDF of the tool's duration (per tool once it has more than
`min_samples` samples, else over all tools, else an exponential prior with mean 1 s),
T the mean queueing delay a returning program sees, eta how likely the program goes on
after the tool (the negative correlation between turns done and turns left; 1 for a
ReAct loop, which always calls the model after a tool), and Reload the time to
re-prefill the context. A tau of 0 means: do not hold.

    durations = ToolDurations()
    durations.observe("search", 0.4)
    ttl = durations.ttl("search", benefit_s=reload_s + queue_s)
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

PRIOR_MEAN_S = 1.0
_PRIOR_QUANTILES = tuple(i / 20 for i in range(1, 20))  # candidate taus under the prior


def continuum_ttl(samples: Sequence[float], benefit_s: float) -> float:
    """The tau maximizing F(tau) * benefit_s - tau over {0} ∪ samples (samples sorted or not)."""
    if benefit_s <= 0 or not samples:
        return 0.0
    ordered = sorted(samples)
    n = len(ordered)
    best_tau, best_gain = 0.0, 0.0
    for i, tau in enumerate(ordered):
        if i + 1 < n and ordered[i + 1] == tau:
            continue  # F(tau) counts every sample <= tau: take the last of equal ones
        gain = (i + 1) / n * benefit_s - tau
        if gain > best_gain:
            best_tau, best_gain = tau, gain
    return best_tau


def prior_ttl(benefit_s: float, mean_s: float = PRIOR_MEAN_S) -> float:
    """The same rule under an exponential prior (no observations yet)."""
    if benefit_s <= 0:
        return 0.0
    best_tau, best_gain = 0.0, 0.0
    for q in _PRIOR_QUANTILES:
        tau = -mean_s * math.log(1 - q)
        gain = q * benefit_s - tau
        if gain > best_gain:
            best_tau, best_gain = tau, gain
    return best_tau


@dataclass
class ToolDurations:
    """Observed tool durations, per tool and overall, and the TTL they imply."""

    min_samples: int = 100
    eta: float = 1.0
    _by_tool: dict[str, list[float]] = field(default_factory=dict)
    _all: list[float] = field(default_factory=list)

    def observe(self, tool: str, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"tool {tool!r}: a duration cannot be negative ({seconds})")
        bisect.insort(self._by_tool.setdefault(tool, []), seconds)
        bisect.insort(self._all, seconds)

    def samples(self, tool: str) -> Sequence[float]:
        """The samples the rule uses for `tool`: its own, else everyone's (may be empty)."""
        own = self._by_tool.get(tool, [])
        return own if len(own) > self.min_samples else self._all

    def median(self, tool: str) -> float:
        """The expected wait on `tool` (the prior's median without observations)."""
        s = self.samples(tool)
        return s[len(s) // 2] if s else PRIOR_MEAN_S * math.log(2)

    def ttl(self, tool: str, *, reload_s: float, queue_s: float) -> float:
        """Seconds to hold a program's KV while `tool` runs (0: do not hold)."""
        benefit = queue_s * self.eta + reload_s
        s = self.samples(tool)
        return continuum_ttl(s, benefit) if s else prior_ttl(benefit)
