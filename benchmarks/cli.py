"""`teola bench`: the paper's benchmark on simulated engines."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from teola_benchmarks.harness import BenchResult, bench
from teola_benchmarks.overhead import measure_overhead, pin_to_one_core
from teola_benchmarks.systems import SYSTEMS
from teola_benchmarks.workloads import WORKLOADS


def add_bench_command(commands: Any) -> None:
    p = commands.add_parser("bench", help="compare Teola with the paper's baselines on simulated engines")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="advanced_rag")
    p.add_argument("--rate", type=float, default=0.5, help="Poisson arrival rate, queries per second")
    p.add_argument("--rates", type=str, default=None, help="comma-separated rates for a sweep (with --plot)")
    p.add_argument("--queries", type=int, default=40)
    p.add_argument("--time-scale", type=float, default=0.1, help="multiplies every simulated latency")
    p.add_argument("--systems", type=str, default=",".join(SYSTEMS), help="comma-separated system names")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object (a list for a sweep)")
    p.add_argument("--plot", type=str, default=None, help="write a latency-vs-rate PNG here")
    p.add_argument("--overhead", action="store_true", help="measure dispatches per second on zero-latency engines")
    p.set_defaults(handler=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    workload = WORKLOADS[args.workload]
    if args.overhead:
        pin_to_one_core()
        result = asyncio.run(measure_overhead(workload, args.queries))
        if args.json:
            print(json.dumps(result.to_json()))
        else:
            print(
                f"{result.workload}: {result.primitives} primitives for {result.queries} queries in "
                f"{result.seconds:.2f} s: {result.dispatches_per_s:,.0f} dispatches/s on one core"
            )
        return 0
    if args.time_scale <= 0:
        raise SystemExit("teola bench: --time-scale must be > 0 (use --overhead for zero-latency engines)")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise SystemExit(f"teola bench: unknown system(s) {unknown}; known: {sorted(SYSTEMS)}")
    rates = [float(r) for r in args.rates.split(",")] if args.rates else [args.rate]
    results = [
        asyncio.run(
            bench(
                workload,
                rate=rate,
                queries=args.queries,
                time_scale=args.time_scale,
                systems=systems,
                seed=args.seed,
            )
        )
        for rate in rates
    ]
    if args.json:
        payload = [r.to_json() for r in results]
        print(json.dumps(payload[0] if len(payload) == 1 else payload))
    else:
        console = Console()
        for r in results:
            console.print(_table(r))
    if args.plot:
        from teola_benchmarks.plot import plot_sweep

        plot_sweep(results, args.plot)
        if not args.json:
            print(f"wrote {args.plot}")
    return 0


def _table(result: BenchResult) -> Table:
    table = Table(
        title=f"{result.workload} at {result.rate} q/s, {result.queries} queries "
        f"(critical path {result.critical_path_s:.2f} s)"
    )
    for column in ("system", "mean s", "p50 s", "p99 s", "mean vs teola"):
        table.add_column(column, justify="right" if column != "system" else "left")
    teola = result.systems.get("teola")
    for name, r in result.systems.items():
        s = r.summary()
        ratio = f"{s['mean_s'] / teola.summary()['mean_s']:.2f}x" if teola else "-"
        table.add_row(name, f"{s['mean_s']:.2f}", f"{s['p50_s']:.2f}", f"{s['p99_s']:.2f}", ratio)
    return table
