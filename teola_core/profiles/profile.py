"""Engine latency profiles: latency as a function of batch size (or tokens).

A profile holds one curve per operation of an engine, keyed by primitive kind:
`embed`, `ingest`, `search`, `rerank` over items in the batch; for an LLM, `prefill`
over tokens prefilled in one step and `decode` over sequences decoding together (the
latency of one decode step). Between measured points latency is interpolated linearly;
beyond the last point it is extrapolated from the last two points.

    >>> p = LatencyProfile("embedder", {"embed": Curve(((1, 0.1), (4, 0.15), (16, 0.45), (32, 0.9)))})
    >>> p.max_efficient_batch("embed")
    16
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Curve:
    """Measured (x, seconds) points, x ascending (items, tokens or sequences)."""

    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        pts = tuple(sorted((float(x), float(s)) for x, s in self.points))
        if not pts:
            raise ValueError("a latency curve needs at least one point")
        if any(x <= 0 or s < 0 for x, s in pts):
            raise ValueError(f"latency curve points must have x > 0 and seconds >= 0: {pts}")
        object.__setattr__(self, "points", pts)

    def latency(self, x: float) -> float:
        pts = self.points
        if x <= 0:
            return 0.0
        if len(pts) == 1:
            x0, s0 = pts[0]
            return s0 * x / x0 if x > x0 else s0
        xs = [p[0] for p in pts]
        i = bisect.bisect_left(xs, x)
        if i < len(pts) and xs[i] == x:
            return pts[i][1]
        if i == 0:
            return pts[0][1]  # below the first point: a batch is never cheaper than one
        if i == len(pts):
            (x0, s0), (x1, s1) = pts[-2], pts[-1]
        else:
            (x0, s0), (x1, s1) = pts[i - 1], pts[i]
        return max(0.0, s0 + (s1 - s0) * (x - x0) / (x1 - x0))

    def scaled(self, factor: float) -> Curve:
        """Every latency multiplied by `factor`."""
        return Curve(tuple((x, s * factor) for x, s in self.points))

    def max_efficient(self, tolerance: float = 0.1) -> int:
        """The smallest measured x whose throughput is within `tolerance` of the best.

        That is where throughput stops growing: larger batches only add latency.
        """
        best = max(x / s for x, s in self.points if s > 0) if any(s > 0 for _, s in self.points) else None
        if best is None:
            return int(self.points[-1][0])
        for x, s in self.points:
            if s > 0 and x / s >= (1 - tolerance) * best:
                return int(x)
        return int(self.points[-1][0])


@dataclass(frozen=True)
class LatencyProfile:
    engine: str
    curves: Mapping[str, Curve] = field(default_factory=dict)

    def curve(self, op: str) -> Curve:
        try:
            return self.curves[op]
        except KeyError:
            raise KeyError(
                f"profile of engine {self.engine!r} has no curve {op!r} (has {sorted(self.curves)})"
            ) from None

    def latency(self, op: str, x: float) -> float:
        return self.curve(op).latency(x)

    def max_efficient_batch(self, op: str, tolerance: float = 0.1) -> int:
        return self.curve(op).max_efficient(tolerance)

    def scaled(self, factor: float) -> LatencyProfile:
        """Every latency multiplied by `factor` (the benchmark's time scale)."""
        return LatencyProfile(
            self.engine,
            {op: c.scaled(factor) for op, c in self.curves.items()},
        )

    def with_op_scaled(self, op: str, factor: float) -> LatencyProfile:
        """One op's latencies multiplied by `factor` (0: free), the others as they are."""
        if factor < 0:
            raise ValueError(f"a latency factor must be >= 0, got {factor}")
        return LatencyProfile(self.engine, {**self.curves, op: self.curve(op).scaled(factor)})

    def to_json(self) -> dict[str, object]:
        return {"engine": self.engine, "curves": {op: [list(p) for p in c.points] for op, c in self.curves.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> LatencyProfile:
        curves = data["curves"]
        assert isinstance(curves, Mapping)
        return cls(str(data["engine"]), {op: Curve(tuple(tuple(p) for p in pts)) for op, pts in curves.items()})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> LatencyProfile:
        return cls.from_json(json.loads(Path(path).read_text()))
