"""A simulated engine of one primitive kind whose batch costs one latency curve.

The embedder and the reranker charge a batch the profile's curve at the batch's total
items (texts to embed, documents to score), then compute every call alone, so a
failing call fails alone, as the engine protocol says.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from teola_adapters.simulated.clock import EngineStats, SimClock, count_items
from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits
from teola_core.ir.kinds import PrimitiveKind
from teola_core.profiles.profile import LatencyProfile


class OneCurveEngine(Engine):
    """`kind` only; a batch costs the profile's `curve` at its calls' items on input `items_port`."""

    kind: ClassVar[PrimitiveKind]
    curve: ClassVar[str]
    items_port: ClassVar[str]

    def __init__(self, profile: LatencyProfile, *, time_scale: float, name: str, concurrency: int) -> None:
        profile.curve(self.curve)  # fail now, not on the first batch
        self.name = name
        self.kinds = frozenset({self.kind})
        self.profile = profile
        self.limits = EngineLimits(concurrency=concurrency)
        self.clock = SimClock(time_scale, concurrency)
        self.stats = EngineStats()

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        items = sum(count_items(c.inputs.get(self.items_port)) for c in calls)
        await self.clock.spend_batch(self.profile.latency(self.curve, items), self.stats, len(calls), items)
        return [self._one(c) for c in calls]

    @abstractmethod
    def _one(self, call: Call) -> CallResult:
        """One call's outputs, or the exception it fails with."""
