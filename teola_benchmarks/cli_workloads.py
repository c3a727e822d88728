"""`teola bench --workload NAME`: the paper's workloads, Teola against every baseline, one
table (or JSON object) per arrival rate; `--overhead`: dispatches per second on one core."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from typing import TypeVar

from rich.console import Console
from rich.table import Table

from teola.cli_support import bounded_int, positive_float, working
from teola_benchmarks.harness import BenchResult, run_bench, simulated_engines, speedups
from teola_benchmarks.overhead import measure_overhead, pin_to_one_core
from teola_benchmarks.real_engines import real_engines
from teola_benchmarks.systems import SYSTEMS
from teola_benchmarks.what_if import OpChange, WhatIf, misprofiled, what_if
from teola_benchmarks.workloads import WORKLOADS, Workload

T = TypeVar("T")


def run_workload_bench(args: argparse.Namespace) -> int:
    """`--workload NAME`: the paper's workloads, Teola against every baseline."""
    real = args.engines == "local-real"
    clock = args.clock or ("real" if real or args.time_scale is not None else "virtual")  # a scale: real time
    if real and clock == "virtual":
        raise SystemExit("teola bench: --engines local-real runs in real time; use --clock real")
    if clock == "virtual" and args.time_scale is not None and not args.overhead:
        raise SystemExit("teola bench: --time-scale is for --clock real (the virtual clock needs none)")
    args.queries = (4 if real else 40) if args.queries is None else args.queries
    time_scale = args.time_scale if args.time_scale is not None else 1.0 if real or clock == "virtual" else 0.1
    if real and time_scale != 1.0:
        raise SystemExit("teola bench: --engines local-real runs in real time; --time-scale must be 1")
    workload = WORKLOADS[args.workload]
    changes = _changes(args.what_if, workload, real=real, clock=clock, flag="--what-if")
    stale = _changes(args.misprofiled, workload, real=real, clock=clock, flag="--misprofiled")
    make_engines, planned = misprofiled(stale) if stale else (real_engines if real else simulated_engines, None)
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
    if time_scale <= 0:
        raise SystemExit("teola bench: --time-scale must be > 0 (use --overhead for zero-latency engines)")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise SystemExit(f"teola bench: unknown system(s) {unknown}; known: {sorted(SYSTEMS)}")
    rates = _numbers(args.rates, "--rates", positive_float) if args.rates else [0.5 if args.rate is None else args.rate]
    seeds = _numbers(args.seeds, "--seeds", bounded_int(0)) if args.seeds else [args.seed]
    what = f"{args.workload}, {args.queries} queries a system, {clock} clock"
    runs = len(rates) * len(seeds)
    results = []
    with working(what if runs == 1 else f"{what}, {runs} runs", total=runs * len(systems)) as done:
        for rate in rates:
            results.append(
                run_bench(
                    workload,
                    clock=clock,
                    time_scale=time_scale,
                    rate=rate,
                    queries=args.queries,
                    systems=systems,
                    seeds=seeds,
                    make_engines=make_engines,
                    on_system=lambda _: done(1),
                    planned_profiles=planned,
                )
            )
    what_ifs = [[what_if(r, workload, change) for change in changes] for r in results]
    if args.json:
        payload = [
            {**r.to_json(), "what_if": [w.to_json() for w in found]} if found else r.to_json()
            for r, found in zip(results, what_ifs, strict=True)
        ]
        print(json.dumps(payload[0] if len(payload) == 1 else payload))
    else:
        console = Console()
        for r, found in zip(results, what_ifs, strict=True):
            console.print(_table(r))
            if found:
                console.print(_what_if_table(found))
    if args.plot:
        from teola_benchmarks.plot import plot_sweep

        plot_sweep(results, args.plot)
        if not args.json:
            print(f"wrote {args.plot}")
    return 0


def _changes(texts: list[str], workload: Workload, *, real: bool, clock: str, flag: str) -> list[OpChange]:
    """The `--what-if` or `--misprofiled` changes; one that cannot be run exits with one line saying why."""
    if texts and (real or clock != "virtual"):
        raise SystemExit(f"teola bench: {flag} runs simulated engines on the virtual clock (exact runs to compare)")
    try:
        changes = [OpChange.parse(text) for text in texts]
        for change in changes:
            change.check(workload)
        return changes
    except ValueError as exc:
        raise SystemExit(f"teola bench: {flag}: {exc}") from None


def _what_if_table(found: list[WhatIf]) -> Table:
    """Teola with each change against the unchanged best baseline."""
    base = found[0].base
    best = base.best_baseline()
    table = Table(title=f"what if: Teola with one op scaled, {best} as it is (the most a pass on that op could win)")
    table.add_column("change", no_wrap=True)
    for column in ("critical path s", "bound s", "teola mean s", "teola p99 s", "mean vs teola", "p99 vs teola"):
        table.add_column(column, justify="right")
    for w in found:
        s = w.changed.summary("teola")
        bound = w.changed.queueing_bound_s()
        table.add_row(
            str(w.change),
            f"{w.changed.critical_path_s:.2f}",
            "-" if bound is None else f"{bound:.2f}",
            f"{s['mean_s']:.2f}",
            f"{s['p99_s']:.2f}",
            f"{w.vs_best('mean_s') or 0:.2f}x",
            f"{w.vs_best('p99_s') or 0:.2f}x",
        )
    return table


def _numbers(text: str, option: str, parse: Callable[[str], T]) -> list[T]:
    """A comma-separated list of `parse`d values; a bad one exits with one line naming it."""
    try:
        return [parse(part.strip()) for part in text.split(",") if part.strip()]
    except argparse.ArgumentTypeError as exc:
        raise SystemExit(f"teola bench: {option}: {exc} (hint: e.g. {option} 0.5,1,2)") from None


def _table(result: BenchResult) -> Table:
    """Teola, today's baselines, then the paper's (labelled); each baseline's mean and p99 over Teola's."""
    seeds = ",".join(map(str, result.seeds))
    best = result.best_baseline()
    headline = ""
    if "teola" in result.systems and best is not None:
        headline = (
            f"\nTeola vs the best baseline ({best}): {speedups(result)[best]:.2f}x mean, "
            f"{speedups(result, 'p99_s')[best]:.2f}x p99"
        )
    bound = result.queueing_bound_s()
    limits = f"critical path {result.critical_path_s:.2f} s"
    if bound is not None and result.busiest is not None:
        limits += f", queueing bound {bound:.2f} s ({result.busiest.engine}: {result.busiest.work_s:.2f} s a query)"
    table = Table(
        title=f"{result.workload} at {result.rate} q/s, {result.queries} queries, seed(s) {seeds}, "
        f"{result.clock} clock\n({limits}){headline}"
    )
    for column in ("system", "mean s", "p50 s", "p99 s", "mean vs teola", "p99 vs teola"):
        table.add_column(column, justify="right" if column != "system" else "left")
    ratios = speedups(result) if "teola" in result.systems else {}
    tails = speedups(result, "p99_s") if "teola" in result.systems else {}
    order = sorted(result.systems, key=lambda n: (n != "teola", SYSTEMS[n].paper))
    for name in order:
        s = result.summary(name)
        label = f"{name} (paper)" if SYSTEMS[name].paper else name
        mean_ratio = f"{ratios[name]:.2f}x" if name in ratios else "-"
        tail_ratio = f"{tails[name]:.2f}x" if name in tails else "-"
        table.add_row(label, f"{s['mean_s']:.2f}", f"{s['p50_s']:.2f}", f"{s['p99_s']:.2f}", mean_ratio, tail_ratio)
    return table
