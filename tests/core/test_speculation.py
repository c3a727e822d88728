"""Speculative nodes: they take only idle engine time and are given up, unstarted, once
they are all their consumer waits for (graph and engine schedulers driven event by event)."""

from __future__ import annotations

import pytest

from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.errors import GraphError
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import PortSpec, PrimitiveKind
from teola_core.ir.speculation import SPECULATIVE, Speculation
from teola_core.ir.types import PortType
from teola_core.scheduler.engine_scheduler import EngineScheduler
from teola_core.scheduler.events import (
    BatchFinished,
    Dispatch,
    NodeFinished,
    NodeReady,
    NodeWithdrawn,
    QueryCancelRequested,
    QueryDone,
    QuerySubmitted,
    RunBatch,
    Withdrawn,
    WithdrawNode,
    WithdrawRequested,
)
from teola_core.scheduler.graph_scheduler import GraphScheduler
from teola_core.scheduler.graph_state import NodeState

GUESS = Speculation("join", {"vectors": ()})


def _guess(b: GraphBuilder, texts: Value, speculation: Speculation | None = GUESS) -> Value:
    node = b.add(PrimitiveKind.EMBED, {"texts": texts}, engine="emb", name="guess", config={SPECULATIVE: speculation})
    return Value(node.id, "vectors")


def _graph(guess_after: bool = False) -> Graph:
    """q -> embed "guess" (speculative) ─┐
       q -> call "known" ───────────────┴-> join -> output
    (`guess_after`: the guess also waits for a call "late")."""
    b = GraphBuilder("speculation")
    q = b.input("q", PortType.TEXTS)
    texts = b.call(lambda q: q, {"q": q}, name="late") if guess_after else q
    guess = _guess(b, texts)
    known = b.call(lambda q: len(q), {"q": q}, name="known")
    join = b.call(lambda n, v: (n, list(v)), {"n": known, "v": guess}, name="join")
    b.output(value=join)
    return b.build()


def _submit(gs: GraphScheduler, graph: Graph) -> list:
    return gs.handle(QuerySubmitted(query_id="q1", graph=graph, inputs={"q": ["a", "b"]}, now=0.0))


def _done(node_id: str, **outputs: object) -> NodeFinished:
    return NodeFinished(query_id="q1", node_id=node_id, outputs=outputs, now=1.0)


def test_a_dispatched_guess_is_withdrawn_once_it_is_all_its_consumer_waits_for() -> None:
    g = _graph()
    gs = GraphScheduler()
    guess, known = _submit(gs, g)
    assert (guess.node.id, known.node.id) == ("guess", "known")
    assert gs.handle(_done("known", value=2)) == [WithdrawNode(query_id="q1", node=g.nodes["guess"])]
    [join] = gs.handle(NodeWithdrawn(query_id="q1", node_id="guess", now=2.0))
    assert join == Dispatch(query_id="q1", node=g.nodes["join"], inputs={"n": 2, "v": ()}, depth=2.0, arrival=0.0)
    assert gs.story("q1", "guess")[-1].cause == "withdrawn unstarted"


def test_a_guess_that_finishes_first_is_used_and_one_that_started_runs_on() -> None:
    g = _graph()
    first = GraphScheduler()
    _submit(first, g)
    assert first.handle(_done("guess", vectors=[[1.0], [2.0]])) == []
    [join] = first.handle(_done("known", value=2))
    assert join.inputs == {"n": 2, "v": [[1.0], [2.0]]}

    late = GraphScheduler()  # its engine had started it: no NodeWithdrawn comes, its result does
    _submit(late, g)
    assert late.handle(_done("known", value=2)) == [WithdrawNode(query_id="q1", node=g.nodes["guess"])]
    [join] = late.handle(_done("guess", vectors=[[1.0], [2.0]]))
    assert join.inputs == {"n": 2, "v": [[1.0], [2.0]]}


def test_a_guess_given_up_before_its_inputs_exist_is_never_dispatched() -> None:
    g = _graph(guess_after=True)
    gs = GraphScheduler()
    late, known = _submit(gs, g)
    assert (late.node.id, known.node.id) == ("late", "known")
    assert gs.handle(_done("known", value=2)) == []  # nothing dispatched to withdraw
    [join] = gs.handle(_done("late", value=["a", "b"]))
    assert join.node.id == "join" and join.inputs == {"n": 2, "v": ()}
    assert gs.state("q1", "guess") == NodeState.DONE
    assert [t.cause for t in gs.story("q1", "guess")] == ["given up before it was ready"]
    assert gs.handle(_done("join", value=(2, []))) == [QueryDone(query_id="q1", outputs={"value": (2, [])})]


def _ready(qid: str, node_id: str, graph: Graph, *, arrival: float = 0.0) -> NodeReady:
    node = graph.nodes[node_id]
    return NodeReady(query_id=qid, node=node, inputs={"texts": ["t"]}, depth=1.0, arrival=arrival, items=1, now=0.0)


def _ids(actions: list) -> list[str]:
    return [f"{c.query_id}.{c.node.id}" for a in actions if isinstance(a, RunBatch) for c in a.calls]


def test_the_engine_starts_a_guess_only_when_it_has_nothing_else_to_do() -> None:
    g = _graph()
    work = _work()
    es = EngineScheduler("emb", max_batch_items=8)
    [busy] = es.handle(_ready("q0", "guess", work))
    assert es.handle(_ready("q2", "guess", g, arrival=2.0), _ready("q1", "guess", g, arrival=1.0)) == []
    assert (es.pending, es.spare) == (0, 2)
    queued = es.handle(_ready("q3", "guess", work))  # ordinary work arrives while the engine runs
    assert queued == []
    after_busy = es.handle(BatchFinished(batch_id=busy.batch_id, now=1.0))
    assert _ids(after_busy) == ["q3.guess"]  # ordinary work first, and guesses never ride along
    after_work = es.handle(BatchFinished(batch_id=after_busy[0].batch_id, now=2.0))
    assert _ids(after_work) == ["q1.guess"]  # then one guess alone, earliest query first
    assert es.handle(WithdrawRequested(query_id="q1", node_id="guess", now=2.5)) == []  # started: runs on
    assert es.handle(WithdrawRequested(query_id="q2", node_id="guess", now=2.5)) == [
        Withdrawn(query_id="q2", node=g.nodes["guess"])
    ]
    assert es.handle(BatchFinished(batch_id=after_work[0].batch_id, now=3.0)) == []
    assert es.spare == 0


def test_a_cancelled_query_leaves_no_guess_behind() -> None:
    g = _graph()
    es = EngineScheduler("emb", max_batch_items=8)
    [busy] = es.handle(_ready("q0", "guess", _work()))
    es.handle(_ready("q1", "guess", g))
    es.handle(QueryCancelRequested(query_id="q1", now=1.0))
    assert es.spare == 0
    assert es.handle(BatchFinished(batch_id=busy.batch_id, now=2.0)) == []


def _work() -> Graph:
    """The same embed, not speculative: ordinary work on the same engine."""
    b = GraphBuilder("work")
    q = b.input("q", PortType.TEXTS)
    b.output(v=_guess(b, q, None))
    return b.build()


@pytest.mark.parametrize(
    ("speculation", "error"),
    [
        (Speculation("nobody", {"vectors": ()}), "by exactly one data edge"),
        (Speculation("join", {}), "no withdrawn value for output port(s) ['vectors']"),
    ],
)
def test_a_malformed_speculation_is_a_graph_error_naming_the_node(speculation: Speculation, error: str) -> None:
    b = GraphBuilder("bad")
    q = b.input("q", PortType.TEXTS)
    guess = _guess(b, q, speculation)
    b.output(value=b.call(lambda v: v, {"v": guess}, name="join"))
    with pytest.raises(GraphError, match=r"speculative node 'guess'.*") as raised:
        b.build()
    assert error in str(raised.value)


def test_only_engine_work_can_be_speculative() -> None:
    b = GraphBuilder("bad")
    q = b.input("q", PortType.TEXTS)
    node = b.add(
        PrimitiveKind.CALL,
        {"q": q},
        config={"fn": lambda q: q, SPECULATIVE: Speculation("join", {"value": ()})},
        input_ports=(PortSpec("q", PortType.ANY),),
        output_ports=(PortSpec("value", PortType.ANY),),
        name="guess",
    )
    guess = Value(node.id, "value")
    b.output(value=b.call(lambda v: v, {"v": guess}, name="join"))
    with pytest.raises(GraphError, match="only engine work can wait for idle engine time"):
        b.build()
