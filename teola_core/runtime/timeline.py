"""The per-primitive timeline of a run, from the runtime's `PrimitiveSpan` hook.

    recorder = SpanRecorder()
    fast = teola.optimize(chain, hooks=[recorder])
    fast.invoke(question)
    plot_timeline(recorder.spans, {}, Path("timeline.png"), "one question")


One row per engine and primitive kind (plus the user steps), one bar per span, coloured
by the question it served (nested map elements count as their question). Inline work
(formatting, merges: zero duration) is left out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from teola_core.runtime.base import PrimitiveSpan


@dataclass
class SpanRecorder:
    """A runtime hook that keeps every span (one recorder per run)."""

    spans: list[PrimitiveSpan] = field(default_factory=list)

    def on_span(self, span: PrimitiveSpan) -> None:
        self.spans.append(span)


class RecentSpans:
    """A runtime hook that keeps the last `limit` spans: what `explain()` reports and draws."""

    def __init__(self, limit: int = 2000) -> None:
        self._spans: deque[PrimitiveSpan] = deque(maxlen=limit)

    def on_span(self, span: PrimitiveSpan) -> None:
        self._spans.append(span)

    def spans(self) -> list[PrimitiveSpan]:
        return list(self._spans)


def row_of(span: PrimitiveSpan) -> str:
    """A span's row in the timeline: its engine (or user code) and its primitive kind."""
    where = span.node.engine or "user code"
    return f"{where} · {span.node.kind.value}"


def plot_timeline(spans: list[PrimitiveSpan], labels: dict[str, str], path: Path, title: str) -> Path:
    """Write a Gantt chart PNG of the spans; `labels` maps a root query id to its legend text."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [s for s in spans if s.ended_at > s.started_at]
    if not shown:
        raise ValueError("no primitive spans with a duration to plot")
    t0 = min(s.ready_at for s in shown)
    rows = sorted({row_of(s) for s in shown}, key=lambda r: (r.startswith("user"), r))
    colours = plt.get_cmap("tab10")
    order = {q: i for i, q in enumerate(labels)}
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.45 * len(rows)))
    for span in shown:
        root = span.query_id.split("/")[0]
        y = rows.index(row_of(span))
        ax.barh(
            y,
            span.ended_at - span.started_at,
            left=span.started_at - t0,
            height=0.7,
            color=colours(order.get(root, 9) % 10),
            edgecolor="black",
            linewidth=0.3,
        )
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first query started")
    ax.set_title(title, fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours(order[q] % 10)) for q in labels]
    ax.legend(handles, list(labels.values()), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
