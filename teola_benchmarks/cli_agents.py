"""`teola bench --agents`: concurrent ReAct agents, the plain agent vs Teola's agent runtime,
on a simulated LLM in virtual time, or on llama.cpp in real time (`--engines local-real`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from teola.cli_support import working
from teola_benchmarks.systems import SYSTEMS


def run_agents_bench(args: argparse.Namespace) -> int:
    """`--agents`: trace-driven agents on the simulated LLM (see `teola_benchmarks.agents`)."""
    if args.engines == "local-real":
        return run_agents_llamacpp_bench(args)
    from teola_adapters.simulated.virtual_time import run_virtual
    from teola_benchmarks.agents.bench import H100_KV_TOKENS, POOL_FRACTION, bench_agents, system_names

    concurrency = 32 if args.concurrency is None else args.concurrency
    if concurrency < 1:
        raise SystemExit("teola bench: --concurrency must be >= 1")
    time_scale = 1.0 if args.time_scale is None else args.time_scale  # virtual time: no need to scale
    if time_scale <= 0:
        raise SystemExit("teola bench: --time-scale must be > 0")
    systems = system_names() if args.systems == ",".join(SYSTEMS) else tuple(s.strip() for s in args.systems.split(","))
    if args.kv_pool is not None and args.kv_pool_tokens is not None:
        raise SystemExit("teola bench: give --kv-pool or --kv-pool-tokens, not both")
    pool_tokens = None
    if args.kv_pool_tokens is not None:
        text = args.kv_pool_tokens.strip().lower()
        if text != "h100" and not text.isdigit():
            raise SystemExit(f"teola bench: --kv-pool-tokens takes a number of tokens or 'h100', not {text!r}")
        pool_tokens = H100_KV_TOKENS if text == "h100" else int(text)
    try:
        with working(f"{concurrency} agents x {len(systems)} systems on a simulated LLM (virtual time)"):
            result = run_virtual(  # simulated time jumps: exact, repeatable, as fast as the CPU allows
                bench_agents(
                    concurrency=concurrency,
                    time_scale=time_scale,
                    seed=args.seed,
                    systems=systems,
                    pool_fraction=POOL_FRACTION if args.kv_pool is None else args.kv_pool,
                    pool_tokens=pool_tokens,
                )
            )
    except ValueError as exc:
        raise SystemExit(f"teola bench: {exc}") from exc
    if args.json:
        print(json.dumps(result.to_json()))
        return 0
    title = (
        f"{concurrency} concurrent agents, KV pool {result.kv_pool_tokens:,} tokens "
        f"({result.kv_pool_fraction:.2f} of their live contexts; answers identical)"
    )
    columns = {"recomputed prefill": "recomputed_prefill_tokens", "prefix hit rate": "prefix_hit_rate"}
    table = _agents_table(title, columns, {name: r.summary() for name, r in result.systems.items()})
    Console().print(table)
    return 0


def run_agents_llamacpp_bench(args: argparse.Namespace) -> int:
    """`--agents --engines local-real`: the agents on llama.cpp in real time (`teola_benchmarks.agents.llamacpp`)."""
    from teola_benchmarks.agents.llamacpp import SYSTEMS as AGENT_SYSTEMS
    from teola_benchmarks.agents.llamacpp import bench_agents_llamacpp

    concurrency = 4 if args.concurrency is None else args.concurrency
    tool_time_scale = 0.1 if args.time_scale is None else args.time_scale
    systems = (
        AGENT_SYSTEMS
        if args.systems == ",".join(SYSTEMS)
        else tuple(s.strip() for s in args.systems.split(",") if s.strip())
    )
    try:
        with working(f"{concurrency} agents x {len(systems)} systems on llama.cpp (real time)"):
            result = asyncio.run(
                bench_agents_llamacpp(
                    concurrency=concurrency, seed=args.seed, systems=systems, tool_time_scale=tool_time_scale
                )
            )
    except ValueError as exc:
        raise SystemExit(f"teola bench: {exc}") from exc
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        same = "answers identical" if not result.mismatches else "ANSWERS DIFFER"
        title = (
            f"{concurrency} agents on llama.cpp (SmolLM2-135M, 1 thread), state cache "
            f"{result.cache_tokens:,} tokens, tools x{tool_time_scale:g} ({same})"
        )
        columns = {
            "prompt tokens": "prompt_tokens",
            "evaluated": "prefill_tokens",
            "recomputed": "recomputed_prefill_tokens",
            "reused": "prefix_hit_rate",
        }
        table = _agents_table(title, columns, {name: r.summary() for name, r in result.systems.items()})
        Console().print(table)
    if result.mismatches:  # greedy decoding is bit-identical by design: a difference is a bug to look into
        for name, where in result.mismatches.items():
            print(f"teola bench: {name} answered differently than {systems[0]}: {where}", file=sys.stderr)
        return 1
    return 0


def _agents_table(title: str, columns: dict[str, str], systems: dict[str, dict[str, Any]]) -> Table:
    """Mean and p95 JCT, the given summary keys by column title, and the mean's ratio to plain."""
    table = Table(title=title)
    for column in ("system", "mean JCT s", "p95 JCT s", *columns, "vs plain"):
        table.add_column(column, justify="left" if column == "system" else "right")
    plain = systems.get("plain")
    for name, s in systems.items():
        cells = [f"{s[key]:.1%}" if isinstance(s[key], float) else f"{s[key]:,}" for key in columns.values()]
        ratio = f"{plain['mean_s'] / s['mean_s']:.2f}x" if plain else "-"
        table.add_row(name, f"{s['mean_s']:.1f}", f"{s['p95_s']:.1f}", *cells, ratio)
    return table
