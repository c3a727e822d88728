"""The demo's picture: what each engine did, plain and optimized, on one time axis.

    bars = llama_bars(work, run_start, questions) + call_bars(calls, run_start, run_end)
    draw([Run("plain LangChain", bars, latencies, total), ...], questions, title, path)

One panel per run, one lane per engine (SmolLM2 on llama.cpp, MiniLM, pgvector) and a lane
of answers (when each question was answered). A llama.cpp bar is coloured by the question it
served; a decode step that advanced several questions at once is striped with all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LANES = (
    ("llama", "SmolLM2\n(llama.cpp)"),
    ("embed", "MiniLM\n(embeddings)"),
    ("search", "pgvector\n(search)"),
)
_ANSWERS = "answers"
_MERGE_GAP_S = 0.002  # closer bars of the same work are drawn as one


@dataclass(frozen=True)
class Bar:
    """Work on one engine lane, in seconds from the run's start."""

    lane: str  # "llama", "embed" or "search"
    began: float
    ended: float
    kind: str  # "prefill", "decode", "embed" or "search"
    questions: tuple[int, ...] = ()  # the questions it served (0-based; empty: not known)


@dataclass(frozen=True)
class Run:
    label: str
    bars: list[Bar]
    latencies: list[float]  # each question's, in question order
    total: float


def question_of(call: Any, questions: Sequence[str]) -> int | None:
    """The question whose text the call's prompt holds (the demo's prompts all quote it)."""
    inputs = call.inputs
    text = inputs.get("prompt", inputs.get("prefix"))
    if text is None and inputs.get("kv") is not None:
        text = inputs["kv"].prompt
    if not isinstance(text, str):
        return None
    return next((i for i, q in enumerate(questions) if q in text), None)


def llama_bars(work: Sequence[Any], start: float, questions: Sequence[str]) -> list[Bar]:
    """Bars of the llama.cpp engine's `WorkDone` records after `start`, runs of equal work merged."""
    bars: list[Bar] = []
    for done in work:
        if done.began < start:
            continue
        served = tuple(sorted({q for c in done.calls if (q := question_of(c, questions)) is not None}))
        bar = Bar("llama", done.began - start, done.ended - start, done.kind, served)
        last = bars[-1] if bars else None
        if last and (last.kind, last.questions) == (bar.kind, bar.questions) and bar.began - last.ended < _MERGE_GAP_S:
            bars[-1] = Bar("llama", last.began, bar.ended, bar.kind, bar.questions)
        else:
            bars.append(bar)
    return bars


def call_bars(calls: Sequence[tuple[str, float, float]], start: float, end: float) -> list[Bar]:
    """Bars of the (kind, began, ended) calls from `start` to `end`, overlapping ones joined
    (the engine was busy or had calls queued)."""
    bars: list[Bar] = []
    for kind, began, ended in sorted((c for c in calls if start <= c[1] <= end), key=lambda c: c[1]):
        same = [i for i, b in enumerate(bars) if b.kind == kind]
        last = bars[same[-1]] if same else None
        if last is not None and began - start <= last.ended + _MERGE_GAP_S:
            bars[same[-1]] = Bar(kind, last.began, max(last.ended, ended - start), kind)
        else:
            bars.append(Bar(kind, began - start, ended - start, kind))
    return bars


def draw(runs: Sequence[Run], questions: Sequence[str], title: str, path: Path) -> Path:
    """Write the picture (PNG) and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    colors = plt.get_cmap("tab10").colors
    end = max(max(r.total for r in runs), max((b.ended for r in runs for b in r.bars), default=0.0)) * 1.03
    lanes = [*LANES, (_ANSWERS, "answers")]
    fig, axes = plt.subplots(len(runs), 1, figsize=(13, 2.1 * len(runs) + 1.6), sharex=True, squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        rows = {lane: len(lanes) - 1 - i for i, (lane, _) in enumerate(lanes)}
        for bar in run.bars:
            _draw_bar(ax, bar, rows[bar.lane], colors)
        for q, latency in enumerate(run.latencies):
            ax.plot([latency], [rows[_ANSWERS]], marker="v", color=colors[q % len(colors)], markersize=11)
        for latency, names in _answer_labels(run.latencies, end * 0.015):
            ax.annotate(names, (latency, rows[_ANSWERS]), xytext=(0, 8), textcoords="offset points", ha="center")
        ax.axvline(run.total, color="0.3", linestyle="--", linewidth=1)
        mean = sum(run.latencies) / len(run.latencies)
        ax.set_title(f"{run.label}: {run.total:.1f} s in total, mean latency {mean:.1f} s", loc="left", fontsize=11)
        ax.set_yticks(list(rows.values()), [label for _, label in lanes])
        ax.set_ylim(-0.6, len(lanes) - 0.4)
        ax.set_xlim(0, end)
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since the questions were asked")
    handles = [Patch(color=colors[q % len(colors)], label=f"Q{q + 1}: {text}") for q, text in enumerate(questions)]
    handles += [
        Patch(facecolor="0.75", hatch="///", edgecolor="0.35", label="llama.cpp reading a prompt (prefill)"),
        Patch(facecolor="0.35", label="llama.cpp writing (decode; stripes: several questions in one step)"),
        Patch(facecolor="0.55", label="MiniLM embedding / pgvector search (busy or queued)"),
    ]
    fig.suptitle(title, fontsize=12)
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=9, frameon=False, bbox_to_anchor=(0.5, 0))
    fig.tight_layout(rect=(0, 0.04 + 0.035 * ((len(handles) + 1) // 2), 1, 0.96))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _answer_labels(latencies: Sequence[float], close: float) -> list[tuple[float, str]]:
    """One label per group of answers less than `close` seconds apart: ("Q1, Q2", at the first)."""
    groups: list[tuple[float, list[str]]] = []
    for q, latency in sorted(enumerate(latencies), key=lambda x: x[1]):
        if groups and latency - groups[-1][0] < close:
            groups[-1][1].append(f"Q{q + 1}")
        else:
            groups.append((latency, [f"Q{q + 1}"]))
    return [(at, ", ".join(names)) for at, names in groups]


def _draw_bar(ax: Any, bar: Bar, row: int, colors: Sequence[Any]) -> None:
    width = max(bar.ended - bar.began, 0.004)
    if bar.lane != "llama":
        ax.broken_barh([(bar.began, width)], (row - 0.3, 0.6), facecolors="0.55")
        return
    served = bar.questions or (-1,)
    height = 0.6 / len(served)
    for i, q in enumerate(served):
        color = "0.6" if q < 0 else colors[q % len(colors)]
        prefill = bar.kind == "prefill"
        ax.broken_barh(
            [(bar.began, width)],
            (row - 0.3 + i * height, height),
            facecolors=color,
            alpha=0.55 if prefill else 1.0,
            hatch="///" if prefill else None,
            edgecolor="0.35" if prefill else color,
            linewidth=0,
        )
