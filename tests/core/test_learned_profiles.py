"""Learned profiles (`teola_core.profiles.learning`) and the estimates the passes plan with."""

from __future__ import annotations

import json

import pytest

from teola_core.ir.builder import GraphBuilder
from teola_core.ir.kinds import PrimitiveKind as K
from teola_core.ir.split_units import Lines
from teola_core.ir.types import PortType
from teola_core.passes.base import PassContext
from teola_core.passes.decode_pipelining import DecodePipelining
from teola_core.passes.estimates import LATENCY_KEY, critical_path, estimated_latency, serial_time
from teola_core.passes.prefill_split import PrefillSplit
from teola_core.profiles.learning import LatencyBook, differs, merged
from teola_core.profiles.profile import Curve, LatencyProfile


def test_medians_per_bucket_ignore_a_slow_outlier_and_follow_the_window() -> None:
    book = LatencyBook(window=4)
    for s in (0.30, 0.31, 0.29, 9.0):
        book.observe("step:r", "run", 1, s)
    assert book.profiles(min_samples=1)["step:r"].latency("run", 1) == pytest.approx(0.305)
    for _ in range(4):  # the app changed: the window forgets the old runs
        book.observe("step:r", "run", 1, 0.1)
    assert book.profiles(min_samples=1)["step:r"].latency("run", 1) == pytest.approx(0.1)


def test_batch_sizes_make_a_curve_and_too_few_samples_none() -> None:
    book = LatencyBook()
    for n, s in ((1, 0.1), (1, 0.1), (4, 0.15), (5, 0.17), (16, 0.45)):
        book.observe("embed:E", "embed", n, s)
    curve = book.profiles(min_samples=1)["embed:E"].curve("embed")
    assert curve.points == ((1.0, 0.1), (4.5, 0.16), (16.0, 0.45))
    assert "embed:E" not in book.profiles(min_samples=6)


def test_counts_are_the_low_median_once_seen_enough() -> None:
    book = LatencyBook()
    for n in (3, 3, 4):
        book.observe_count("step:parser", n)
    assert book.count("step:parser") == 3 and book.count("step:parser", min_samples=4) is None
    assert book.counts() == {"step:parser": 3}


def test_a_book_round_trips_through_its_file(tmp_path) -> None:
    book = LatencyBook()
    book.observe("step:r", "run", 1, 0.3)
    book.observe_count("step:p", 5)
    book.call_done()
    path = tmp_path / "sub" / "app.json"
    book.save(path)
    again = LatencyBook.load(path)
    assert again.to_json() == book.to_json() and again.calls == 1
    path.write_text(json.dumps({"engine": "x", "curves": {}}))  # a LatencyProfile file is not a book
    with pytest.raises(ValueError, match="not a file of learned profiles"):
        LatencyBook.load(path)


def test_given_curves_win_and_learned_ones_fill_in() -> None:
    given = {"llm": LatencyProfile("llm", {"decode": Curve(((1, 0.02),))})}
    learned = {
        "llm": LatencyProfile("llm", {"decode": Curve(((1, 0.5),)), "prefill": Curve(((1, 0.01),))}),
        "step:r": LatencyProfile("step:r", {"run": Curve(((1, 0.3),))}),
    }
    out = merged(given, learned)
    assert out["llm"].latency("decode", 1) == 0.02 and out["llm"].latency("prefill", 1) == 0.01
    assert out["step:r"].latency("run", 1) == 0.3


def test_differs_only_on_news() -> None:
    a = {"step:r": LatencyProfile("step:r", {"run": Curve(((1, 0.30),))})}
    assert not differs(a, {"step:r": LatencyProfile("step:r", {"run": Curve(((1, 0.31),))})})
    assert differs(a, {"step:r": LatencyProfile("step:r", {"run": Curve(((1, 0.5),))})})
    assert differs(a, {**a, "step:s": a["step:r"]})
    assert not differs({**a, "step:s": a["step:r"]}, a)  # a key no longer seen is no news


def test_a_steps_observed_time_places_its_output_and_splits_the_prompt() -> None:
    b = GraphBuilder("rag")
    q = b.input("q", PortType.TEXT)
    docs = b.call(lambda q: q, {"q": q}, name="retrieve")
    prompt = b.format("Answer {q} from {docs}", q=q, docs=docs)
    b.output(answer=b.llm(prompt, engine="llm", max_tokens=4).text)
    graph = b.build()
    retrieve = graph.nodes["retrieve"]
    keyed = graph.edit()
    keyed.replace_node(retrieve.with_config(**{LATENCY_KEY: "step:retriever"}))
    graph = keyed.freeze()

    known = PassContext(profiles={"step:retriever": LatencyProfile("step:retriever", {"run": Curve(((1, 0.3),))})})
    assert estimated_latency(graph.nodes["retrieve"], known) == 0.3
    assert PrefillSplit().run(graph, PassContext()) is graph  # nothing known: everything ready at once
    assert any(n.kind == K.PARTIAL_PREFILL for n in PrefillSplit().run(graph, known).nodes.values())
    short = PassContext(profiles=known.profiles, min_overlap_s=0.5)  # an overlap too short to pay
    assert PrefillSplit().run(graph, short) is graph


def test_partial_decodes_share_their_decodes_time() -> None:
    b = GraphBuilder("expand")
    q = b.input("q", PortType.TEXT)
    out = b.llm(b.format("{q}", q=q), engine="llm", max_tokens=30, split_unit=Lines(), expected_items=3)
    b.output(items=out.items)
    graph = DecodePipelining().run(b.build(), PassContext())
    ctx = PassContext(profiles={"llm": LatencyProfile("llm", {"decode": Curve(((1, 0.01),))})})
    parts = [n for n in graph.nodes.values() if n.kind == K.PARTIAL_DECODE]
    assert len(parts) == 3 and all(estimated_latency(p, ctx) == pytest.approx(0.1) for p in parts)
    assert critical_path(graph, ctx) == pytest.approx(0.3) == serial_time(graph, ctx)


def test_a_models_observed_call_outweighs_a_per_token_decode_estimate() -> None:
    b = GraphBuilder("one")
    q = b.input("q", PortType.TEXT)
    b.output(answer=b.llm(b.format("{q}", q=q), engine="llm", max_tokens=10).text)
    graph = b.build()
    decode = graph.nodes["llm.decode"].with_config(**{LATENCY_KEY: "step:model"})
    engine = {"llm": LatencyProfile("llm", {"decode": Curve(((1, 0.01),))})}
    step = {"step:model": LatencyProfile("step:model", {"run": Curve(((1, 0.5),))})}
    assert estimated_latency(decode, PassContext(profiles=engine)) == pytest.approx(0.1)
    assert estimated_latency(decode, PassContext(profiles={**engine, **step})) == 0.5  # prompt's prefill included
    assert estimated_latency(graph.nodes["llm.prefill"], PassContext(profiles=step)) == 0.0
