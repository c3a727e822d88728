"""`teola bench --serve-overload [--soak-minutes N] [--json]`: run and print the overload benchmark."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from teola_benchmarks.overload.bench import OverloadResult, SoakResult, run_overload, run_soak


def run_from_args(args: argparse.Namespace) -> int:
    """Exit status 1 when a target was missed."""
    result: OverloadResult | SoakResult
    split = args.split_cpus
    if args.soak_minutes:
        result = run_soak(minutes=args.soak_minutes, seed=args.seed, split_cpus=split)
    else:
        result = run_overload(seed=args.seed, split_cpus=split)
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        Console().print(_table(result))
    return 0 if all(result.checks.values()) else 1


def _table(result: OverloadResult | SoakResult) -> Table:
    data = result.to_json()
    load = ", ".join(f"{when} {' '.join(f'{x:.2f}' for x in avg)}" for when, avg in result.load.items())
    table = Table(title=f"teola serve overload: capacity R = {result.capacity_per_s:.0f} req/s (load average {load})")
    for column in ("phase", "sent", "answered", "503", "timed out", "other", "goodput/s", "p50 s", "p99 s"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    phases = data["phases"] if "phases" in data else {"soak": data["soak"]}
    for name, p in phases.items():
        table.add_row(
            name,
            str(p["sent"]),
            str(p["answered"]),
            str(p["shed_503"]),
            str(p["timed_out"]),
            ", ".join(f"{k}: {v}" for k, v in p["other"].items()) or "-",
            f"{p['goodput_per_s']:.0f}",
            f"{p['p50_s']:.3f}" if p["p50_s"] is not None else "-",
            f"{p['p99_s']:.3f}" if p["p99_s"] is not None else "-",
        )
    notes = {k: v for k, v in data.items() if k not in ("phases", "soak", "checks", "load_average", "capacity_per_s")}
    table.caption = (
        "; ".join(f"{k} {v}" for k, v in notes.items())
        + "\n"
        + "; ".join(f"{'PASS' if ok else 'FAIL'} {name}" for name, ok in result.checks.items())
    )
    return table
