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
from teola_benchmarks.app_names import LANGCHAIN_EXAMPLES, LANGGRAPH_EXAMPLES, LLAMAINDEX_EXAMPLES
from teola_benchmarks.framework_result import FrameworkBenchResult
from teola_benchmarks.harness import CLOCKS, BenchResult, run_bench, simulated_engines, speedups
from teola_benchmarks.overhead import measure_overhead, pin_to_one_core
from teola_benchmarks.real_engines import real_engines
from teola_benchmarks.systems import SYSTEMS
from teola_benchmarks.workloads import WORKLOADS

T = TypeVar("T")


def add_bench_command(commands: Any) -> None:
    p = commands.add_parser(
        "bench",
        help="compare Teola with today's and the paper's baselines",
        description="Compare Teola with the baselines users run today (async chains on engines that batch "
        "server-side, prefix caching on) and the paper's (LlamaDist, LlamaDistPC; PO and TO batching), on one "
        "workload, an example LangChain/LangGraph/LlamaIndex app, or agents. Progress goes to stderr.",
        formatter_class=DefaultsFormatter,
    )
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="advanced_rag", help="the paper's workload to run")
    p.add_argument("--rate", type=positive_float, default=0.5, help="Poisson arrival rate, queries per second")
    p.add_argument("--rates", type=str, default=None, help="comma-separated rates for a sweep (with --plot)")
    p.add_argument(
        "--queries", type=bounded_int(1), default=None, help="queries per system (default 40; 16 with --langchain)"
    )
    p.add_argument(
        "--clock",
        choices=CLOCKS,
        default=None,
        help="--workload: virtual (default on simulated engines: exact, repeatable, seconds to run, "
        "immune to CPU load) or real (wall clock; the default with --time-scale or --engines local-real)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="real clock: multiplies every simulated latency (default 0.1; 0.5 with --langchain); "
        "giving it selects the real clock",
    )
    p.add_argument("--systems", type=str, default=",".join(SYSTEMS), help="comma-separated system names")
    p.add_argument("--seed", type=bounded_int(0), default=0, help="the arrival sequence (and agent job set)")
    p.add_argument(
        "--seeds",
        type=str,
        default=None,
        help="--workload: comma-separated seeds (instead of --seed): one arrival sequence each, "
        "summarised together (mean over all, and each seed's)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (a list for several rates or seeds)")
    p.add_argument("--plot", type=str, default=None, help="write a latency-vs-rate PNG here")
    p.add_argument("--overhead", action="store_true", help="measure dispatches per second on zero-latency engines")
    p.add_argument(
        "--call-overhead",
        action="store_true",
        help="Teola's cost per call (microseconds) of invoke, ainvoke, batch and abatch on zero-latency LangChain "
        "chains (ten lambdas; prompt | model | parser), against LangChain's own",
    )
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
        "--langgraph",
        choices=LANGGRAPH_EXAMPLES,
        default=None,
        metavar="EXAMPLE",
        help=f"an example LangGraph graph, graph.ainvoke vs teola.optimize, on simulated OpenAI-compatible "
        f"servers ({', '.join(LANGGRAPH_EXAMPLES)})",
    )
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="--langgraph: the LLM server runs at most this many requests at once (vLLM's option); "
        "Teola is given the same bound (model_concurrency)",
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
        help="--langchain/--llamaindex/--langgraph: queries in flight (default 4); "
        "--agents: concurrent agents (default 32; 4 with --engines local-real)",
    )
    p.add_argument(
        "--kv-pool",
        type=float,
        default=None,
        help="--agents: the KV pool as a share of the agents' live contexts (default 0.33)",
    )
    p.add_argument(
        "--kv-pool-tokens",
        type=str,
        default=None,
        help="--agents: a fixed KV pool in tokens, the same for any agent count ('h100': an 80 GB H100's, "
        "~491k tokens beside an 8B model)",
    )
    p.add_argument(
        "--batching",
        choices=("dynamic", "request"),
        default="dynamic",
        help="--langchain/--llamaindex: how the embedding/rerank servers batch concurrent requests",
    )
    p.add_argument(
        "--serve-overload",
        action="store_true",
        help="teola serve (a 50 ms model app) at twice its measured capacity for 20 s, 3 s client deadline "
        "(see teola_benchmarks.overload); exit status 1 if a target is missed",
    )
    p.add_argument(
        "--soak-minutes",
        type=float,
        default=0.0,
        help="with --serve-overload: a soak at 1.5x capacity for this many minutes instead (not for CI)",
    )
    p.set_defaults(handler=bench_command)


def bench_command(args: argparse.Namespace) -> int:
    if args.serve_overload:  # needs the serve extra and aiohttp: imported only here
        from teola_benchmarks.overload.report import run_from_args

        return run_from_args(args)
    if args.call_overhead:
        return run_call_overhead(args)
    if sum(map(bool, (args.langchain, args.llamaindex, args.langgraph, args.agents))) > 1:
        raise SystemExit("teola bench: --langchain, --llamaindex, --langgraph and --agents are exclusive")
    if args.max_num_seqs is not None and not args.langgraph:
        raise SystemExit("teola bench: --max-num-seqs is for --langgraph")
    if args.seeds and (args.langchain or args.llamaindex or args.langgraph or args.agents or args.overhead):
        raise SystemExit("teola bench: --seeds is for --workload runs (use --seed with --agents)")
    if args.agents:
        return run_agents_bench(args)
    args.concurrency = 4 if args.concurrency is None else args.concurrency
    if args.langchain:
        return run_langchain_bench(args)
    if args.llamaindex:
        return run_llamaindex_bench(args)
    if args.langgraph:
        return run_langgraph_bench(args)
    return run_workload_bench(args)


def run_call_overhead(args: argparse.Namespace) -> int:
    """`--call-overhead`: per-call cost on zero-latency chains (needs langchain-core)."""
    from teola_benchmarks.langchain.call_overhead import measure_call_overhead

    with working("per-call overhead on zero-latency LangChain chains"):
        table = measure_call_overhead(calls=args.queries or 200)
    if args.json:
        print(json.dumps(table.to_json()))
        return 0
    for row in table.rows:
        print(
            f"{row.chain:<20} {row.method:<8} langchain {row.langchain_s * 1e6:8.1f} us   "
            f"teola {row.teola_s * 1e6:8.1f} us   {row.ratio:.2f}x"
        )
    return 0


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
    rates = _numbers(args.rates, "--rates", positive_float) if args.rates else [args.rate]
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
                    make_engines=real_engines if real else simulated_engines,
                    on_system=lambda _: done(1),
                )
            )
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
    time_scale = _app_time_scale(args, " (use --overhead for zero-latency fakes)")
    with working(f"{args.langchain}: plain LangChain vs teola.optimize on simulated servers"):
        result = bench_langchain(
            args.langchain,
            queries=args.queries or 16,
            concurrency=args.concurrency,
            time_scale=time_scale,
            batching=args.batching,
        )
    return _report_app(args, result, result.example)


def _app_time_scale(args: argparse.Namespace, hint: str = "") -> float:
    """An app bench's time scale (0.5 unless given), which must be > 0."""
    time_scale = 0.5 if args.time_scale is None else args.time_scale
    if time_scale <= 0:
        raise SystemExit(f"teola bench: --time-scale must be > 0{hint}")
    return time_scale


def _report_app(args: argparse.Namespace, result: FrameworkBenchResult, title: str) -> int:
    """An app bench's result: one JSON object with --json, else its table."""
    if args.json:
        print(json.dumps(result.to_json()))
        return 0
    Console().print(result.table(title))
    return 0


def run_llamaindex_bench(args: argparse.Namespace) -> int:
    """`--llamaindex EXAMPLE`: needs openai, fastapi and uvicorn (QueryPipelines: llama-index-core <= 0.12)."""
    from teola_benchmarks.llamaindex.bench import bench_llamaindex

    if args.overhead:
        raise SystemExit("teola bench: --overhead is not available with --llamaindex")
    time_scale = _app_time_scale(args)
    with working(f"{args.llamaindex}: LlamaIndex vs teola.optimize on simulated servers"):
        result = bench_llamaindex(
            args.llamaindex,
            queries=args.queries or 16,
            concurrency=args.concurrency,
            time_scale=time_scale,
            batching=args.batching,
        )
    return _report_app(args, result, f"{result.example} (LlamaIndex)")


def run_langgraph_bench(args: argparse.Namespace) -> int:
    """`--langgraph EXAMPLE`: needs langchain-openai, fastapi and uvicorn (imported only here)."""
    from teola_benchmarks.langgraph.bench import bench_langgraph

    if args.overhead:
        raise SystemExit("teola bench: --overhead is not available with --langgraph")
    time_scale = _app_time_scale(args)
    if args.max_num_seqs is not None and args.max_num_seqs < 1:
        raise SystemExit("teola bench: --max-num-seqs must be >= 1")
    with working(f"{args.langgraph}: LangGraph vs teola.optimize on simulated servers"):
        result = bench_langgraph(
            args.langgraph,
            queries=args.queries or 16,
            concurrency=args.concurrency,
            time_scale=time_scale,
            batching=args.batching,
            max_num_seqs=args.max_num_seqs,
        )
    bound = f", server max_num_seqs {args.max_num_seqs}" if args.max_num_seqs else ""
    return _report_app(args, result, f"{result.example} (LangGraph{bound})")


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
