"""`teola bench`: the paper's benchmark on simulated engines."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from rich.console import Console
from rich.table import Table

from teola.cli_support import DefaultsFormatter, bounded_int, positive_float, working
from teola_benchmarks.harness import BenchResult, bench, simulated_engines
from teola_benchmarks.overhead import measure_overhead, pin_to_one_core
from teola_benchmarks.real_engines import real_engines
from teola_benchmarks.systems import SYSTEMS
from teola_benchmarks.workloads import WORKLOADS

# The examples `--langchain` accepts (kept here so the parser needs no LangChain import).
LANGCHAIN_EXAMPLES = ("naive_rag", "multi_query_rag", "multi_query_retriever", "rerank_rag", "assign_pipeline")
# The apps `--llamaindex` accepts: QueryPipelines (`teola_benchmarks.llamaindex.examples`,
# llama-index-core <= 0.12) and query engines (`...llamaindex.query_engines`, both lines).
LLAMAINDEX_EXAMPLES = ("multi_query_rag", "fusion_rag", "naive_rag", "fusion_query_engine")
T = TypeVar("T")


def add_bench_command(commands: Any) -> None:
    p = commands.add_parser(
        "bench",
        help="compare Teola with the paper's baselines on simulated engines",
        description="Compare Teola with the paper's baselines (LlamaDist, LlamaDistPC; PO and TO batching) "
        "on one workload, or an example LangChain/LlamaIndex app, or agents. Progress goes to stderr.",
        formatter_class=DefaultsFormatter,
    )
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="advanced_rag", help="the paper's workload to run")
    p.add_argument("--rate", type=positive_float, default=0.5, help="Poisson arrival rate, queries per second")
    p.add_argument("--rates", type=str, default=None, help="comma-separated rates for a sweep (with --plot)")
    p.add_argument(
        "--queries", type=bounded_int(1), default=None, help="queries per system (default 40; 16 with --langchain)"
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="multiplies every simulated latency (default 0.1; 0.5 with --langchain)",
    )
    p.add_argument("--systems", type=str, default=",".join(SYSTEMS), help="comma-separated system names")
    p.add_argument("--seed", type=bounded_int(0), default=0, help="the arrival sequence (and agent job set)")
    p.add_argument(
        "--seeds",
        type=str,
        default=None,
        help="--workload: comma-separated seeds (instead of --seed), one run per seed and rate "
        "(one run is one arrival draw)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (a list for several rates or seeds)")
    p.add_argument("--plot", type=str, default=None, help="write a latency-vs-rate PNG here")
    p.add_argument("--overhead", action="store_true", help="measure dispatches per second on zero-latency engines")
    p.add_argument(
        "--engines",
        choices=("simulated", "local-real"),
        default="simulated",
        help="the workloads' engines: simulated (profile-driven) or the real embedded ones "
        "(SmolLM2 on llama.cpp, MiniLM, embedded pgvector; real time, so the time scale is 1); "
        "with --agents: SmolLM2 on llama.cpp, one thread, real time, tool waits scaled by --time-scale (0.1)",
    )
    p.add_argument(
        "--langchain",
        choices=LANGCHAIN_EXAMPLES,
        default=None,
        metavar="EXAMPLE",
        help=f"an example LangChain chain, plain vs teola.optimize, on simulated OpenAI-compatible servers "
        f"({', '.join(LANGCHAIN_EXAMPLES)}); with --overhead: invoke on zero-latency fakes",
    )
    p.add_argument(
        "--llamaindex",
        choices=LLAMAINDEX_EXAMPLES,
        default=None,
        metavar="EXAMPLE",
        help=f"an example LlamaIndex app, its own execution vs teola.optimize, on simulated "
        f"OpenAI-compatible servers ({', '.join(LLAMAINDEX_EXAMPLES)}; the QueryPipelines need "
        f"llama-index-core <= 0.12, fusion_query_engine runs on 0.12 and 0.14)",
    )
    p.add_argument(
        "--agents",
        action="store_true",
        help="concurrent ReAct agents (trace-driven) on a simulated LLM with a bounded KV pool: "
        "the plain agent vs Teola's agent runtime, each feature alone and all together "
        "(--engines local-real: on llama.cpp with SmolLM2, plain vs teola)",
    )
    p.add_argument(
        "--concurrency",
        type=bounded_int(1),
        default=None,
        help="--langchain/--llamaindex: queries in flight (default 4); "
        "--agents: concurrent agents (default 32; 4 with --engines local-real)",
    )
    p.add_argument(
        "--batching",
        choices=("dynamic", "request"),
        default="dynamic",
        help="--langchain/--llamaindex: how the embedding/rerank servers batch concurrent requests",
    )
    p.set_defaults(handler=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    if sum(map(bool, (args.langchain, args.llamaindex, args.agents))) > 1:
        raise SystemExit("teola bench: --langchain, --llamaindex and --agents are exclusive")
    if args.seeds and (args.langchain or args.llamaindex or args.agents or args.overhead):
        raise SystemExit("teola bench: --seeds is for --workload runs (use --seed with --agents)")
    if args.agents:
        return run_agents_bench(args)
    args.concurrency = 4 if args.concurrency is None else args.concurrency
    if args.langchain:
        return run_langchain_bench(args)
    if args.llamaindex:
        return run_llamaindex_bench(args)
    real = args.engines == "local-real"
    args.queries = (4 if real else 40) if args.queries is None else args.queries
    args.time_scale = (1.0 if real else 0.1) if args.time_scale is None else args.time_scale
    if real and args.time_scale != 1.0:
        raise SystemExit("teola bench: --engines local-real runs in real time; --time-scale must be 1")
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
    rates = _numbers(args.rates, "--rates", positive_float) if args.rates else [args.rate]
    seeds = _numbers(args.seeds, "--seeds", bounded_int(0)) if args.seeds else [args.seed]
    if args.plot and len(seeds) > 1:
        raise SystemExit("teola bench: --plot draws one arrival sequence; give one seed")
    runs = [(rate, seed) for rate in rates for seed in seeds]
    what = f"{args.workload}, {args.queries} queries a system ({'real' if real else f'x{args.time_scale:g} time'})"
    results = []
    label = what if len(runs) == 1 else f"{what}, {len(runs)} runs"
    with working(label, total=len(runs) * len(systems)) as done:
        for rate, seed in runs:
            results.append(
                asyncio.run(
                    bench(
                        workload,
                        rate=rate,
                        queries=args.queries,
                        time_scale=args.time_scale,
                        systems=systems,
                        seed=seed,
                        make_engines=real_engines if real else simulated_engines,
                        on_system=lambda _: done(1),
                    )
                )
            )
    if args.json:
        # The documented one-run object; several seeds also name each run's seed.
        payload = [{**r.to_json(), "seed": r.seed} if len(seeds) > 1 else r.to_json() for r in results]
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


def run_langchain_bench(args: argparse.Namespace) -> int:
    """`--langchain EXAMPLE`: needs langchain-openai, fastapi and uvicorn (imported only here)."""
    from teola_benchmarks.langchain.bench import bench_langchain, overhead_langchain

    if args.overhead:
        with working(f"{args.langchain}: invoke overhead on zero-latency fakes"):
            overhead = overhead_langchain(args.langchain, queries=args.queries or 20)
        if args.json:
            print(json.dumps(overhead.to_json()))
        else:
            print(
                f"{overhead.example}: invoke {overhead.langchain_s * 1e3:.2f} ms (langchain) vs "
                f"{overhead.teola_s * 1e3:.2f} ms (teola) on zero-latency fakes: {overhead.ratio:.2f}x"
            )
        return 0
    time_scale = 0.5 if args.time_scale is None else args.time_scale
    if time_scale <= 0:
        raise SystemExit("teola bench: --time-scale must be > 0 (use --overhead for zero-latency fakes)")
    result = _framework_bench(bench_langchain, args.langchain, "plain LangChain", args, time_scale)
    if args.json:
        print(json.dumps(result.to_json()))
        return 0
    Console().print(result.table(result.example))
    return 0


def run_llamaindex_bench(args: argparse.Namespace) -> int:
    """`--llamaindex EXAMPLE`: needs openai, fastapi and uvicorn (QueryPipelines: llama-index-core <= 0.12)."""
    from teola_benchmarks.llamaindex.bench import bench_llamaindex

    if args.overhead:
        raise SystemExit("teola bench: --overhead is not available with --llamaindex")
    time_scale = 0.5 if args.time_scale is None else args.time_scale
    if time_scale <= 0:
        raise SystemExit("teola bench: --time-scale must be > 0")
    result = _framework_bench(bench_llamaindex, args.llamaindex, "LlamaIndex", args, time_scale)
    if args.json:
        print(json.dumps(result.to_json()))
        return 0
    Console().print(result.table(f"{result.example} (LlamaIndex)"))
    return 0


def _framework_bench(run: Callable[..., T], example: str, plain: str, args: argparse.Namespace, scale: float) -> T:
    """An example app, plain vs teola.optimize on simulated servers, with a progress row."""
    with working(f"{example}: {plain} vs teola.optimize on simulated servers"):
        return run(
            example, queries=args.queries or 16, concurrency=args.concurrency, time_scale=scale, batching=args.batching
        )


def run_agents_bench(args: argparse.Namespace) -> int:
    """`--agents`: trace-driven agents on the simulated LLM (see `teola_benchmarks.agents`)."""
    if args.engines == "local-real":
        return run_agents_llamacpp_bench(args)
    from teola_benchmarks.agents.bench import bench_agents, system_names
    from teola_benchmarks.virtual_time import run_virtual

    concurrency = 32 if args.concurrency is None else args.concurrency
    if concurrency < 1:
        raise SystemExit("teola bench: --concurrency must be >= 1")
    time_scale = 1.0 if args.time_scale is None else args.time_scale  # virtual time: no need to scale
    if time_scale <= 0:
        raise SystemExit("teola bench: --time-scale must be > 0")
    systems = system_names() if args.systems == ",".join(SYSTEMS) else tuple(s.strip() for s in args.systems.split(","))
    try:
        with working(f"{concurrency} agents x {len(systems)} systems on a simulated LLM (virtual time)"):
            result = run_virtual(  # simulated time jumps: exact, repeatable, as fast as the CPU allows
                bench_agents(concurrency=concurrency, time_scale=time_scale, seed=args.seed, systems=systems)
            )
    except ValueError as exc:
        raise SystemExit(f"teola bench: {exc}") from exc
    if args.json:
        print(json.dumps(result.to_json()))
        return 0
    title = f"{concurrency} concurrent agents, KV pool {result.kv_pool_tokens:,} tokens (answers identical)"
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


def _numbers(text: str, option: str, parse: Callable[[str], T]) -> list[T]:
    """A comma-separated list of `parse`d values; a bad one exits with one line naming it."""
    try:
        return [parse(part.strip()) for part in text.split(",") if part.strip()]
    except argparse.ArgumentTypeError as exc:
        raise SystemExit(f"teola bench: {option}: {exc} (hint: e.g. {option} 0.5,1,2)") from None


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


def _table(result: BenchResult) -> Table:
    table = Table(
        title=f"{result.workload} at {result.rate} q/s, {result.queries} queries, seed {result.seed} "
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
