"""Prefill split: the ready prefix of a prompt is prefilled early; the prompt is never reordered."""

from __future__ import annotations

import asyncio
from typing import Any

from toy_engines import meb_profile, toy_engines

from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import PortSpec, PrimitiveKind
from teola_core.ir.node import ControlEdge, DataEdge
from teola_core.ir.types import Document, PortType, Scored
from teola_core.passes import PassContext, PrefillSplit
from teola_core.passes.prefill_split import estimated_latency, finish_times
from teola_core.profiles.profile import Curve, LatencyProfile
from teola_core.runtime.reference import evaluate

K = PrimitiveKind
TEMPLATE = "Be brief. Q: {question} C: {context} A:"
PROFILES = PassContext(
    profiles={
        "reranker": meb_profile("reranker", seconds=5.0, rerank=4),
        "llm": meb_profile("llm", prefill=1, decode=8),  # per-token prefill: an early prefix pays
    }
)
INPUTS = {"question": "why is the sky blue", "docs": [Document(f"d{i}", f"passage {i}") for i in range(5)]}


def _render(docs: list[Scored]) -> str:
    return " | ".join(s.doc.text for s in docs)


def _rag(template: str = TEMPLATE, guarded: bool = False) -> Graph:
    b = GraphBuilder("prefill")
    q = b.input("question", PortType.TEXT)
    docs = b.input("docs", PortType.DOCS)
    ranked = b.rerank(q, docs, engine="reranker", top_k=2, items=5)
    context = b.call(_render, {"docs": ranked}, name="context", inline=True)
    if guarded:
        cond = b.condition(q, lambda v: 0 if "sky" in v else 1, branches=2)
        with b.branch(cond, 0):
            prompt = b.format(template, question=q, context=context)
            answer = b.llm(prompt, engine="llm", max_tokens=16, temperature=0.0)
    else:
        prompt = b.format(template, question=q, context=context)
        answer = b.llm(prompt, engine="llm", max_tokens=16, temperature=0.0)
    b.output(answer=answer.text)
    return b.build()


def _run(graph: Graph, inputs: dict[str, Any] = INPUTS) -> dict[str, Any]:
    return asyncio.run(evaluate(graph, inputs, toy_engines()))


def test_ready_prefix_is_prefilled_early() -> None:
    g = _rag()
    out = PrefillSplit().run(g, PROFILES)
    assert [(n.id, n.kind) for n in out.nodes.values()][-2:] == [
        ("format/prefix", K.FORMAT),
        ("llm.prefill/partial", K.PARTIAL_PREFILL),
    ]
    prefix = out.nodes["format/prefix"]
    assert prefix.config["template"] == g.nodes["format"].config["template"]
    assert prefix.config["prefix_segments"] == 3
    assert prefix.inputs == (PortSpec("question", PortType.ANY),)
    partial, full = out.nodes["llm.prefill/partial"], out.nodes["llm.prefill"]
    assert (partial.engine, dict(partial.config)) == ("llm", {"temperature": 0.0})
    assert full.kind == K.FULL_PREFILL and dict(full.config) == {"temperature": 0.0}
    assert [p.name for p in full.inputs] == ["prompt", "prefix_kv"]
    new_edges = set(out.data_edges) - set(g.data_edges)
    assert new_edges == {
        DataEdge("input.question", "value", "format/prefix", "question"),
        DataEdge("format/prefix", "prompt", "llm.prefill/partial", "prefix"),
        DataEdge("llm.prefill/partial", "kv", "llm.prefill", "prefix_kv"),
    }
    assert set(g.data_edges) <= set(out.data_edges)  # the full prompt and the decode are untouched
    assert out.notes[-1].startswith("prefill-split: llm.prefill (prefill on llm) prefills the first 3 of 5")
    assert _run(out) == _run(g)


def test_split_is_idempotent() -> None:
    once = PrefillSplit().run(_rag(), PROFILES)
    assert PrefillSplit().run(once, PROFILES) is once


def test_nothing_ready_earlier_returns_the_same_graph() -> None:
    g = _rag()
    assert PrefillSplit().run(g, PassContext()) is g  # no profiles: everything is ready at 0


def test_the_prompt_is_never_reordered() -> None:
    g = _rag("{context} then {question}")
    assert PrefillSplit().run(g, PROFILES) is g  # `question` is ready first but is not a prefix


def test_a_leading_literal_alone_is_a_prefix() -> None:
    g = _rag("Instructions. {context} Q: {question}")
    out = PrefillSplit().run(g, PROFILES)
    assert out.nodes["format/prefix"].config["prefix_segments"] == 1
    assert out.nodes["format/prefix"].inputs == ()
    assert _run(out) == _run(g)


def test_ready_times_follow_the_profiles_longest_path() -> None:
    b = GraphBuilder("race")
    q = b.input("q", PortType.TEXT)
    docs = b.input("docs", PortType.DOCS)
    quick = b.call(lambda s: s.upper(), {"s": q}, name="quick", inline=True)  # user code costs 0
    ranked = b.rerank(q, docs, engine="reranker", top_k=1, items=2)  # 5 s
    inner = b.llm(b.format("say {q}", q=q), engine="llm", max_tokens=2, name="inner")  # 1 + 2 x 1 s
    prompt = b.format("{a} {b} {c}", a=quick, b=ranked, c=inner.text)
    b.output(answer=b.llm(prompt, engine="llm", max_tokens=4).text)
    g = b.build()
    finish = finish_times(g, PROFILES)
    assert finish["quick"] == 0.0 and finish["rerank"] == 5.0 and finish["inner.decode"] == 3.0
    assert estimated_latency(g.nodes["inner.decode"], PROFILES) == 2.0
    # the latest variable is b (rerank, 5 s): the prefix is "{a} " even though c is ready at 3 s
    fmt = g.nodes["format#1"]
    ready = {e.dst_port: finish[e.src] for e in g.data_in(fmt.id)}
    assert PrefillSplit._ready_prefix(fmt.config["template"], ready) == 2
    # the inner prompt has only input variables: nothing is earlier than its latest
    out = PrefillSplit().run(g, PROFILES)
    assert out.nodes["inner.prefill"].kind == K.PREFILL


def test_a_short_prefix_stays_one_prefill_on_an_engine_with_a_step_floor() -> None:
    """The paper's 7B: ~15 ms a step, ~0.26 ms a token. A 3-word prefix saves < 1 ms, costs a step."""
    floor = LatencyProfile("llm", {"prefill": Curve(((16, 0.020), (512, 0.140), (8192, 2.2)))})
    ctx = PassContext(profiles={"reranker": PROFILES.profiles["reranker"], "llm": floor})
    g = _rag()
    assert PrefillSplit().run(g, ctx) is g
    long_instruction = " ".join(["Answer carefully, citing the passages you use."] * 12)  # 72 words
    g = _rag(long_instruction + " Q: {question} C: {context} A:")
    assert any(n.kind == K.PARTIAL_PREFILL for n in PrefillSplit().run(g, ctx).nodes.values())


def test_guards_are_kept_on_the_new_nodes() -> None:
    g = _rag(guarded=True)
    out = PrefillSplit().run(g, PROFILES)
    guards = {c for c in out.control_edges if c.branch is not None}
    assert ControlEdge("condition", "format/prefix", branch=0) in guards
    assert ControlEdge("condition", "llm.prefill/partial", branch=0) in guards
    for question in ("why is the sky blue", "why is grass green"):
        inputs = {**INPUTS, "question": question}
        assert _run(out, inputs) == _run(g, inputs)


def test_a_ready_variable_counts_with_its_learned_length() -> None:
    """A short literal before a long user document: split only once the document's usual
    length (learned from the step that writes it) says the early prefill pays."""
    floor = LatencyProfile("llm", {"prefill": Curve(((16, 0.020), (512, 0.140), (8192, 2.2)))})
    b = GraphBuilder("document")
    question = b.input("question", PortType.TEXT)
    docs = b.input("docs", PortType.DOCS)
    document = b.add(
        K.CALL,
        {"q": question},
        config={"fn": lambda q: f"a long document about {q}", "inline": True, "latency_key": "step:document"},
        input_ports=(PortSpec("q", PortType.ANY),),
        output_ports=(PortSpec("value", PortType.ANY),),
        name="document",
    )
    context = b.call(_render, {"docs": b.rerank(question, docs, engine="reranker", top_k=2, items=5)}, name="context")
    prompt = b.format("Doc: {document} C: {context} A:", document=Value(document.id, "value"), context=context)
    b.output(answer=b.llm(prompt, engine="llm", max_tokens=4).text)
    g = b.build()
    unknown = PassContext(profiles={"reranker": PROFILES.profiles["reranker"], "llm": floor})
    assert PrefillSplit().run(g, unknown) is g  # 1 literal word: not worth a step
    learned = PassContext(profiles=unknown.profiles, output_words={"step:document": 1200})
    split = PrefillSplit().run(g, learned)
    assert any(n.kind == K.PARTIAL_PREFILL for n in split.nodes.values())
    assert _run(split, {**INPUTS}) == _run(g, {**INPUTS})
