"""The pass protocol: a pass is a pure function from graph to graph.

A pass returns a new `Graph` (or the same object when it has nothing to do: that is
how the manager detects the fixed point). It never mutates its input: edit a copy with
`graph.edit()` and `freeze()` it. What a pass needs to know about engines (their
latency profiles, hence their max efficient batch) comes in the `PassContext`.

    class DropNothing(Pass):
        name = "drop-nothing"
        def run(self, graph, ctx):
            return graph
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from teola_core.ir.graph import Graph
from teola_core.profiles.profile import LatencyProfile

if TYPE_CHECKING:
    from teola_core.engines.protocol import EngineSet


@dataclass(frozen=True)
class PassContext:
    """profiles: engine name (or app step key, `estimates.LATENCY_KEY`) -> latency profile.
    tolerance: see `Curve.max_efficient`. min_overlap_s: the least overlap prefill split
    plans for (a shorter one would not pay for the warm-up's round trip). output_words: app
    step key (`estimates.LATENCY_KEY`) -> how many words its text output usually has
    (learned), which tells prefill split how much of a prompt a ready variable fills."""

    profiles: Mapping[str, LatencyProfile] = field(default_factory=dict)
    tolerance: float = 0.1
    min_overlap_s: float = 0.01
    output_words: Mapping[str, int] = field(default_factory=dict)
    devices: Mapping[str, str] = field(default_factory=dict)  # engine -> shared device (`EngineLimits.device`)

    @classmethod
    def of(cls, engines: EngineSet) -> PassContext:
        """What passes see of an engine set: its profiles and the devices its engines share."""
        return cls(profiles=engines.profiles(), devices=engines.devices())

    def same_device(self, a: str | None, b: str | None) -> bool:
        """Whether two engines declare one device (their work adds up instead of overlapping)."""
        device = self.devices.get(a or "")
        return device is not None and device == self.devices.get(b or "")

    def max_efficient_batch(self, engine: str | None, op: str) -> int | None:
        """The engine's max efficient batch for `op`, or None when it has no such profile."""
        profile = self.profiles.get(engine or "")
        if profile is None or op not in profile.curves:
            return None
        return profile.max_efficient_batch(op, self.tolerance)

    def latency(self, engine: str | None, op: str, items: float) -> float | None:
        """The engine's profiled latency for `op` on `items`, or None when it has no such profile."""
        profile = self.profiles.get(engine or "")
        if profile is None or op not in profile.curves:
            return None
        return profile.latency(op, items)


class Pass(ABC):
    name: str = "pass"

    @abstractmethod
    def run(self, graph: Graph, ctx: PassContext) -> Graph:
        """Return the rewritten graph, or `graph` itself if there was nothing to do."""
