"""`explain(png_dir)` draws the e-graph; `hooks=` sees every primitive for a timeline."""

from __future__ import annotations

from pathlib import Path

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from lc_fakes import EchoChat

from teola_core.ir.kinds import PrimitiveKind
from teola_core.runtime.timeline import SpanRecorder, plot_timeline
from teola_langchain import optimize


def _chain():  # type: ignore[no-untyped-def]
    return PromptTemplate.from_template("About {topic}") | EchoChat() | StrOutputParser()


def test_explain_draws_each_e_graph(tmp_path: Path) -> None:
    fast = optimize(_chain())
    text = fast.explain(png_dir=tmp_path)
    pictures = sorted(tmp_path.glob("*-egraph.png"))
    assert pictures, text
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in pictures)
    assert str(pictures[0]) in text
    fast.close()


def test_hooks_record_every_primitive_and_plot_a_timeline(tmp_path: Path) -> None:
    recorder = SpanRecorder()
    chain = _chain()
    fast = optimize(chain, hooks=[recorder], execution="graph")
    assert fast.invoke({"topic": "cats"}) == chain.invoke({"topic": "cats"})
    kinds = {span.node.kind for span in recorder.spans}
    assert {PrimitiveKind.PREFILL, PrimitiveKind.DECODE} <= kinds
    png = plot_timeline(recorder.spans, {}, tmp_path / "timeline.png", "one question")
    assert png.read_bytes().startswith(b"\x89PNG")
    fast.close()


def test_explain_reports_recent_calls_per_engine_and_draws_their_timeline(tmp_path: Path) -> None:
    chain = _chain()
    fast = optimize(chain, execution="graph")
    assert "none recorded yet" in fast.explain()
    assert fast.batch([{"topic": "cats"}, {"topic": "dogs"}]) == chain.batch([{"topic": "cats"}, {"topic": "dogs"}])
    text = fast.explain(png_dir=tmp_path)
    assert "of 2 queries" in text and " · decode: " in text
    assert (tmp_path / "timeline.png").read_bytes().startswith(b"\x89PNG")
    fast.close()
