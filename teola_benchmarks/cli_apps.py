"""`teola bench --langchain / --llamaindex / --langgraph EXAMPLE`: an example app, its own
execution vs `teola.optimize`, on simulated OpenAI-compatible servers; `--call-overhead`:
Teola's cost per call on zero-latency LangChain chains. Each needs its framework, imported
only when its bench runs."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from teola.cli_support import working
from teola_benchmarks.app_names import LANGCHAIN_EXAMPLES, LANGGRAPH_AGENTS
from teola_benchmarks.framework_result import FrameworkBenchResult, summary_table


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


def run_langchain_bench(args: argparse.Namespace) -> int:
    """`--langchain EXAMPLE`: needs langchain-openai, fastapi and uvicorn (imported only here)."""
    from teola_benchmarks.langchain.bench import bench_langchain, overhead_langchain

    if args.overhead:
        if args.langchain == "all":
            raise SystemExit("teola bench: --overhead takes one --langchain example, not all")
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
    if args.langchain == "all":
        results = []
        for example in LANGCHAIN_EXAMPLES:
            with working(f"{example}: plain LangChain vs teola.optimize on simulated servers"):
                results.append(bench_langchain(example, traced=not args.untraced, **_app_options(args, time_scale)))
        if args.json:
            print(json.dumps([r.to_json() for r in results]))
        else:
            Console(width=160).print(summary_table(results))
        return 0
    if args.max_num_seqs is not None and args.max_num_seqs < 1:
        raise SystemExit("teola bench: --max-num-seqs must be >= 1")
    with working(f"{args.langchain}: plain LangChain vs teola.optimize on simulated servers"):
        result = bench_langchain(
            args.langchain, traced=not args.untraced, max_num_seqs=args.max_num_seqs, **_app_options(args, time_scale)
        )
    return _report_app(args, result, result.example)


def _app_time_scale(args: argparse.Namespace, hint: str = "") -> float:
    """An app bench's time scale (0.5 unless given), which must be > 0."""
    time_scale = 0.5 if args.time_scale is None else args.time_scale
    if time_scale <= 0:
        raise SystemExit(f"teola bench: --time-scale must be > 0{hint}")
    return time_scale


def _app_options(args: argparse.Namespace, time_scale: float) -> dict[str, Any]:
    """What every app bench is given from the command line (16 queries unless --queries)."""
    return {
        "queries": args.queries or 16,
        "concurrency": args.concurrency,
        "time_scale": time_scale,
        "batching": args.batching,
    }


def _report_app(args: argparse.Namespace, result: FrameworkBenchResult, title: str) -> int:
    """An app bench's result: one JSON object with --json, else its table."""
    if args.json:
        print(json.dumps(result.to_json()))
        return 0
    Console().print(result.table(title))
    return 0


def run_llamaindex_bench(args: argparse.Namespace) -> int:
    """`--llamaindex EXAMPLE`: needs openai, fastapi and uvicorn (QueryPipelines: llama-index-core <= 0.12;
    workflows: 0.14 and llama-index-llms-openai-like)."""
    from teola_benchmarks.llamaindex.bench import bench_llamaindex

    if args.overhead:
        raise SystemExit("teola bench: --overhead is not available with --llamaindex")
    time_scale = _app_time_scale(args)
    if args.max_num_seqs is not None and args.max_num_seqs < 1:
        raise SystemExit("teola bench: --max-num-seqs must be >= 1")
    with working(f"{args.llamaindex}: LlamaIndex vs teola.optimize on simulated servers"):
        result = bench_llamaindex(args.llamaindex, max_num_seqs=args.max_num_seqs, **_app_options(args, time_scale))
    bound = f", server max_num_seqs {args.max_num_seqs}" if args.max_num_seqs else ""
    return _report_app(args, result, f"{result.example} (LlamaIndex{bound})")


def run_langgraph_bench(args: argparse.Namespace) -> int:
    """`--langgraph EXAMPLE`: needs langchain-openai, fastapi and uvicorn (imported only here)."""
    from teola_benchmarks.langgraph.bench import bench_langgraph

    if args.overhead:
        raise SystemExit("teola bench: --overhead is not available with --langgraph")
    if args.langgraph == LANGGRAPH_AGENTS:
        return run_create_agents_bench(args)
    time_scale = _app_time_scale(args)
    if args.max_num_seqs is not None and args.max_num_seqs < 1:
        raise SystemExit("teola bench: --max-num-seqs must be >= 1")
    with working(f"{args.langgraph}: LangGraph vs teola.optimize on simulated servers"):
        result = bench_langgraph(
            args.langgraph,
            max_num_seqs=args.max_num_seqs,
            rate=args.rate,
            seed=args.seed,
            **_app_options(args, time_scale),
        )
    bound = f", server max_num_seqs {args.max_num_seqs}" if args.max_num_seqs else ""
    return _report_app(args, result, f"{result.example} (LangGraph{bound})")


def run_create_agents_bench(args: argparse.Namespace) -> int:
    """`--langgraph create_agents`: plain `agent.ainvoke` vs `teola.optimize(agent)` on a KV-short server."""
    from teola_benchmarks.langgraph.agents import bench_create_agents

    if args.overhead or args.max_num_seqs is not None or args.rate is not None:
        raise SystemExit("teola bench: --langgraph create_agents takes --concurrency, --seed and --time-scale")
    time_scale = 0.5 if args.time_scale is None else _app_time_scale(args)
    agents = args.concurrency or 32
    with working(f"{agents} create_agent agents: LangGraph vs teola.optimize on a KV-short simulated server"):
        result = bench_create_agents(agents=agents, seed=args.seed, time_scale=time_scale)
    explained = result.pop("explain")
    if args.json:
        print(json.dumps(result))
        return 0
    table = Table(title=f"{agents} create_agent agents, KV cache {result['kv_pool_tokens']} tokens (simulated s)")
    for column in ("system", "mean JCT", "p95 JCT", "recomputed prefill"):
        table.add_column(column)
    for name, s in result["systems"].items():
        table.add_row(name, f"{s['mean_s']:.1f}", f"{s['p95_s']:.1f}", f"{s['recomputed_prefill_tokens']:,}")
    Console().print(table)
    print(f"speedup: {result['speedup_mean']:.2f}x (mean JCT), {result['speedup_p95']:.2f}x (p95)")
    print(next((line for line in explained.splitlines() if line.startswith("- server ")), ""))
    return 0
