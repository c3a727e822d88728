"""`teola bench`: the paper's benchmark on simulated engines.

This module holds the command's options and picks the bench they ask for: the paper's
workloads (`cli_workloads`), an example app or the per-call overhead (`cli_apps`), agents
(`cli_agents`), or `teola serve` under overload (`teola_benchmarks.overload`).
"""

from __future__ import annotations

import argparse
from typing import Any

from teola.cli_support import DefaultsFormatter, bounded_int, positive_float
from teola_benchmarks.app_names import LANGCHAIN_EXAMPLES, LANGGRAPH_AGENTS, LANGGRAPH_EXAMPLES, LLAMAINDEX_EXAMPLES
from teola_benchmarks.cli_agents import run_agents_bench
from teola_benchmarks.cli_apps import run_call_overhead, run_langchain_bench, run_langgraph_bench, run_llamaindex_bench
from teola_benchmarks.cli_workloads import run_workload_bench
from teola_benchmarks.harness import CLOCKS
from teola_benchmarks.systems import SYSTEMS
from teola_benchmarks.workloads import WORKLOADS


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
    p.add_argument(
        "--rate",
        type=positive_float,
        default=None,
        help="Poisson arrival rate, queries per second (default 0.5); --langgraph: runs arrive at this "
        "rate (per simulated second) instead of a closed loop of --concurrency",
    )
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
    p.add_argument(
        "--what-if",
        action="append",
        default=[],
        metavar="ENGINE.OP=FACTOR",
        help="--workload, virtual clock: also run Teola with that op's latencies scaled (0: free), the "
        "baselines unchanged: the most any optimization of that op could win (repeatable)",
    )
    p.add_argument(
        "--misprofiled",
        action="append",
        default=[],
        metavar="ENGINE.OP=FACTOR",
        help="--workload, virtual clock: every system runs with that op FACTOR times its profile while Teola's "
        "passes plan with the profile (a stale profile: what it costs the plan; repeatable)",
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
        choices=(*LANGCHAIN_EXAMPLES, "all"),
        default=None,
        metavar="EXAMPLE",
        help=f"an example LangChain chain, plain vs teola.optimize, on simulated OpenAI-compatible servers "
        f"({', '.join(LANGCHAIN_EXAMPLES)}; all: each in turn, summed up in one table); "
        "with --overhead: invoke on zero-latency fakes",
    )
    p.add_argument(
        "--llamaindex",
        choices=LLAMAINDEX_EXAMPLES,
        default=None,
        metavar="EXAMPLE",
        help=f"an example LlamaIndex app, its own execution vs teola.optimize, on simulated "
        f"OpenAI-compatible servers ({', '.join(LLAMAINDEX_EXAMPLES)}; the QueryPipelines need "
        f"llama-index-core <= 0.12, fusion_query_engine runs on 0.12 and 0.14, drafts_workflow (a Workflow) "
        f"needs 0.14 and llama-index-llms-openai-like)",
    )
    p.add_argument(
        "--langgraph",
        choices=(*LANGGRAPH_EXAMPLES, LANGGRAPH_AGENTS),
        default=None,
        metavar="EXAMPLE",
        help=f"an example LangGraph graph, graph.ainvoke vs teola.optimize, on simulated OpenAI-compatible "
        f"servers ({', '.join(LANGGRAPH_EXAMPLES)}); {LANGGRAPH_AGENTS}: --concurrency create_agent agents (32) "
        f"replaying the agent traces on a server whose KV cache holds a third of their contexts",
    )
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="--langgraph, --langchain EXAMPLE, --llamaindex: the LLM server runs at most this many requests at once "
        "(vLLM's option); Teola learns it from the server's /metrics",
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
        "--untraced",
        action="store_true",
        help="--langchain: run the systems without the tracer every system otherwise has attached "
        "(and whose traces must then be equal)",
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
    p.add_argument(
        "--split-cpus",
        action="store_true",
        help="with --serve-overload: the server on CPU 0 and the load generator on the others, as when clients "
        "run elsewhere (default: both share every CPU)",
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
    if args.max_num_seqs is not None and not (
        args.langgraph or args.llamaindex or (args.langchain and args.langchain != "all")
    ):
        raise SystemExit("teola bench: --max-num-seqs is for --langgraph, --langchain EXAMPLE and --llamaindex")
    not_a_workload_run = args.langchain or args.llamaindex or args.langgraph or args.agents or args.overhead
    if args.seeds and not_a_workload_run:
        raise SystemExit("teola bench: --seeds is for --workload runs (use --seed with --agents)")
    if args.what_if and not_a_workload_run:
        raise SystemExit("teola bench: --what-if is for --workload runs")
    if args.misprofiled and not_a_workload_run:
        raise SystemExit("teola bench: --misprofiled is for --workload runs")
    if args.agents:
        return run_agents_bench(args)
    if args.langgraph and args.rate is not None and args.concurrency is not None:
        raise SystemExit("teola bench: --langgraph takes --rate (open loop) or --concurrency (closed loop), not both")
    args.concurrency = 4 if args.concurrency is None else args.concurrency
    if args.langchain:
        return run_langchain_bench(args)
    if args.llamaindex:
        return run_llamaindex_bench(args)
    if args.langgraph:
        return run_langgraph_bench(args)
    return run_workload_bench(args)
