"""What a framework benchmark (`--langchain`, `--llamaindex`) measured, in one shape.

Both compare the framework's own execution with `teola.optimize` on the same example,
the same simulated servers and the same inputs; latencies are per query, by system.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from teola_benchmarks.stats import summarize


@dataclass
class FrameworkBenchResult:
    example: str
    queries: int
    concurrency: int
    time_scale: float
    batching: str
    latencies: dict[str, list[float]]
    server: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, dict[str, float]]:
        return {name: summarize(values) for name, values in self.latencies.items()}

    def speedups(self) -> dict[str, float]:
        """Mean latency of each other system divided by Teola's (> 1: Teola is faster)."""
        s = self.summary()
        return {name: s[name]["mean_s"] / s["teola"]["mean_s"] for name in s if name != "teola"}

    def best_baseline(self) -> str:
        """The plain system (any spelling, any driver) with the lowest mean latency."""
        s = self.summary()
        return min((name for name in s if name != "teola"), key=lambda name: s[name]["mean_s"])

    def best_alone(self) -> float | None:
        """The fastest any system answered one query alone (`alone_s`): a measured stand-in for
        the chain's critical path (no queueing, every overlap any spelling finds)."""
        alone = self.server.get("alone_s") or {}
        return min(alone.values()) if alone else None

    def teola_vs_best_alone(self) -> float | None:
        """Teola's mean latency under this load over `best_alone()` (1.0: the critical path)."""
        best = self.best_alone()
        return None if not best else self.summary()["teola"]["mean_s"] / best

    def to_json(self) -> dict[str, Any]:
        return {
            "example": self.example,
            "queries": self.queries,
            "concurrency": self.concurrency,
            "time_scale": self.time_scale,
            "batching": self.batching,
            "systems": self.summary(),
            "best_baseline": self.best_baseline(),
            "speedup_vs": self.speedups(),
            "best_alone_s": self.best_alone(),
            "teola_vs_best_alone": self.teola_vs_best_alone(),
            "server": self.server,
        }

    def table(self, what: str) -> Table:
        """A rich table of every system's mean, p50, p99 and its mean against Teola's."""
        best = self.best_baseline()
        table = Table(
            title=f"{what}: {self.queries} queries, concurrency {self.concurrency}, "
            f"time scale {self.time_scale}, {self.batching} batching\n"
            f"Teola vs the best plain system ({best}): {self.speedups()[best]:.2f}x mean"
            + _alone_line(self.best_alone(), self.teola_vs_best_alone())
        )
        for column in ("system", "mean s", "p50 s", "p99 s", "mean vs teola"):
            table.add_column(column, justify="right" if column != "system" else "left")
        speedups = self.speedups()
        for name, s in self.summary().items():
            ratio = f"{speedups[name]:.2f}x" if name in speedups else "1.00x"
            table.add_row(name, f"{s['mean_s']:.2f}", f"{s['p50_s']:.2f}", f"{s['p99_s']:.2f}", ratio)
        return table


def summary_table(results: Sequence[FrameworkBenchResult]) -> Table:
    """One row per example: LangChain as written, the best plain system, Teola, and the ratios."""
    first = results[0]
    table = Table(
        title=f"{len(results)} examples: {first.queries} queries each, concurrency {first.concurrency}, "
        f"time scale {first.time_scale}, {first.batching} batching (mean latency, seconds)"
    )
    for column in ("example", "langchain", "best plain", "teola", "vs langchain", "vs best", "vs best alone"):
        table.add_column(column, justify="left" if column == "example" else "right")
    for r in results:
        s, best = r.summary(), r.best_baseline()
        alone = r.teola_vs_best_alone()
        table.add_row(
            r.example,
            f"{s['langchain']['mean_s']:.2f}",
            f"{s[best]['mean_s']:.2f} ({best})",
            f"{s['teola']['mean_s']:.2f}",
            f"{r.speedups()['langchain']:.2f}x",
            f"{r.speedups()[best]:.2f}x",
            "-" if alone is None else f"{alone:.2f}x",
        )
    return table


def _alone_line(best: float | None, ratio: float | None) -> str:
    if best is None or ratio is None:
        return ""
    return f"\nTeola's mean is {ratio:.2f}x the best one query alone ({best:.2f} s, for the critical path)"


class TeolaVsLangChain:
    """Seconds per call of the same calls, plain LangChain (`langchain_s`) and through Teola (`teola_s`)."""

    langchain_s: float
    teola_s: float

    @property
    def ratio(self) -> float:
        """Teola's time per call over LangChain's (<= 1.2 is the target)."""
        return self.teola_s / self.langchain_s


class AnswerMismatch(AssertionError):
    """A system's answer differs from the framework's own for the same input."""


def check_equal(example: str, inputs: Sequence[Any], answers: dict[str, list[Any]], reference: str) -> None:
    """Every system's answers equal `reference`'s, input by input (else `AnswerMismatch`)."""
    for name, got in answers.items():
        for x, want, have in zip(inputs, answers[reference], got, strict=True):
            if want != have:
                raise AnswerMismatch(
                    f"{example}: {name} answered {have!r} where {reference} answered {want!r} for {x!r}"
                )


def server_figures(backend: Any, alone: dict[str, float]) -> dict[str, Any]:
    """What the simulated servers (`SimServers.backend`) did in a run, and each system's one query alone."""
    return {
        "requests": dict(backend.requests),
        "embed_batches": len(backend.embed_batch_sizes),
        "llm_steps": backend.llm.stats.steps,
        "alone_s": alone,
    }
