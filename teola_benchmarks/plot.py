"""Latency-vs-rate plots of a benchmark sweep (matplotlib, no display needed)."""

from __future__ import annotations

from collections.abc import Sequence

from teola_benchmarks.harness import BenchResult


def plot_sweep(results: Sequence[BenchResult], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [r.rate for r in results]
    fig, (ax_mean, ax_p99) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    for name in results[0].systems:
        means = [r.summary(name)["mean_s"] for r in results]
        p99s = [r.summary(name)["p99_s"] for r in results]
        style = {"linewidth": 2.5} if name == "teola" else {"linestyle": "--"}
        ax_mean.plot(rates, means, marker="o", label=name, **style)
        ax_p99.plot(rates, p99s, marker="o", label=name, **style)
    for ax, what in ((ax_mean, "mean"), (ax_p99, "p99")):
        ax.set_xlabel("arrival rate (queries/s)")
        ax.set_ylabel(f"{what} end-to-end latency (s)")
        ax.grid(alpha=0.3)
    ax_mean.legend()
    fig.suptitle(f"{results[0].workload}: latency vs load ({results[0].queries} queries per rate)")
    fig.savefig(path, dpi=120)
    plt.close(fig)
