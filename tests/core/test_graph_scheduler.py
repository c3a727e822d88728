"""Graph scheduler: fed events step by step, its actions compared exactly (no engines, no clock)."""

from __future__ import annotations

import pytest

from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.errors import GraphError, PrimitiveError
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import MergeMode, PortSpec, PrimitiveKind
from teola_core.ir.node import ControlEdge, DecodePart
from teola_core.ir.split_units import Lines
from teola_core.ir.types import PortType
from teola_core.scheduler.events import (
    CancelNodes,
    Dispatch,
    NodeFailed,
    NodeFinished,
    NodeStarted,
    QueryCancelRequested,
    QueryDone,
    QueryFailed,
    QuerySubmitted,
    SchedulerError,
)
from teola_core.scheduler.graph_scheduler import GraphScheduler
from teola_core.scheduler.graph_state import InvalidTransition, NodeState


def _chain() -> Graph:
    """input.q -> embed -> format -> output"""
    b = GraphBuilder("chain")
    q = b.input("q", PortType.TEXTS)
    v = b.embed(q, engine="emb")
    p = b.format("vectors: {v}", v=v)
    b.output(prompt=p)
    return b.build()


def _fan() -> Graph:
    """input.q -> (a, b) -> join -> output; a and b are independent calls."""
    b = GraphBuilder("fan")
    q = b.input("q")
    a = b.call(str.upper, {"s": q}, name="a")
    c = b.call(str.lower, {"s": q}, name="b")
    j = b.call(lambda x, y: x + y, {"x": a, "y": c}, name="join")
    b.output(v=j)
    return b.build()


def _branchy() -> Graph:
    """A condition picks branch 0 (pos -> pos2) or 1 (neg); a select aggregate joins."""
    b = GraphBuilder("branchy")
    x = b.input("x")
    cond = b.condition(x, lambda v: 0 if v > 0 else 1, branches=2)
    with b.branch(cond, 0):
        pos = b.call(lambda x: f"pos {x}", {"x": x}, name="pos")
    pos2 = b.call(lambda x: x + "!", {"x": pos}, name="pos2")  # unguarded, but needs pos's data
    with b.branch(cond, 1):
        neg = b.call(lambda x: f"neg {x}", {"x": x}, name="neg")
    out = b.aggregate([pos2, neg], MergeMode.SELECT)
    b.output(v=out)
    return b.build()


def _submit(gs: GraphScheduler, graph: Graph, inputs: dict, qid: str = "q1", now: float = 0.0, **kw) -> list:
    return gs.handle(QuerySubmitted(query_id=qid, graph=graph, inputs=inputs, now=now, **kw))


def _done(qid: str, node_id: str, now: float = 1.0, **outputs) -> NodeFinished:
    return NodeFinished(query_id=qid, node_id=node_id, outputs=outputs, now=now)


def test_chain_dispatches_one_node_at_a_time_and_finishes() -> None:
    g = _chain()
    gs = GraphScheduler()
    assert _submit(gs, g, {"q": ["a", "b"]}, now=5.0) == [
        Dispatch(query_id="q1", node=g.nodes["embed"], inputs={"texts": ["a", "b"]}, depth=3.0, arrival=5.0)
    ]
    assert gs.state("q1", "input.q") == NodeState.DONE
    assert gs.state("q1", "embed") == NodeState.READY
    assert gs.handle(_done("q1", "embed", vectors=[[1.0], [2.0]])) == [
        Dispatch(query_id="q1", node=g.nodes["format"], inputs={"v": [[1.0], [2.0]]}, depth=2.0, arrival=5.0)
    ]
    assert gs.handle(_done("q1", "format", prompt="vectors: [[1.0], [2.0]]")) == [
        QueryDone(query_id="q1", outputs={"prompt": "vectors: [[1.0], [2.0]]"})
    ]
    assert "q1" not in gs and gs.queries == ()


def test_depth_map_and_arrival_come_from_the_event() -> None:
    g = _chain()
    gs = GraphScheduler()
    depths = {"embed": 7.5, "format": 1.0}
    [d] = _submit(gs, g, {"q": []}, now=3.0, depths=depths, arrival=1.0)
    assert (d.depth, d.arrival) == (7.5, 1.0)


def test_independent_nodes_are_dispatched_together_and_a_join_waits_for_both() -> None:
    g = _fan()
    gs = GraphScheduler()
    a, b = _submit(gs, g, {"q": "Hi"})
    assert (a.node.id, b.node.id) == ("a", "b")
    assert a.inputs == b.inputs == {"s": "Hi"}
    assert gs.handle(_done("q1", "b", value="hi")) == []
    assert gs.state("q1", "join") == NodeState.WAITING
    [join] = gs.handle(_done("q1", "a", value="HI"))
    assert join.node.id == "join" and join.inputs == {"x": "HI", "y": "hi"}
    assert gs.handle(_done("q1", "join", value="HIhi")) == [QueryDone(query_id="q1", outputs={"v": "HIhi"})]


@pytest.mark.parametrize(
    ("branch", "runs", "skipped", "value"),
    [(0, ["pos", "pos2"], ["neg"], "pos 3!"), (1, ["neg"], ["pos", "pos2"], "neg -3")],
)
def test_condition_guards_and_skip_propagation_follow_the_reference(
    branch: int, runs: list[str], skipped: list[str], value: str
) -> None:
    g = _branchy()
    gs = GraphScheduler()
    [cond] = _submit(gs, g, {"x": 3})
    assert cond.node.id == "condition" and cond.inputs == {"value": 3}
    actions = gs.handle(_done("q1", "condition", branch=branch))
    assert [a.node.id for a in actions] == runs[:1]
    for s in skipped:
        assert gs.state("q1", s) == NodeState.SKIPPED
    results = {"pos": "pos 3", "pos2": "pos 3!", "neg": "neg -3"}
    for node_id in runs:
        actions = gs.handle(_done("q1", node_id, value=results[node_id]))
    # The select aggregate gets only the branch that ran: its other port is optional.
    [agg] = actions
    assert agg.node.id == "aggregate"
    assert agg.inputs == ({"part_0": value} if branch == 0 else {"part_1": value})
    assert gs.handle(_done("q1", "aggregate", value=value)) == [QueryDone(query_id="q1", outputs={"v": value})]


def test_an_order_edge_from_a_skipped_node_only_orders() -> None:
    b = GraphBuilder("ctl")
    x = b.input("x")
    cond = b.condition(x, lambda v: 0, branches=2)
    with b.branch(cond, 1):
        side = b.call(print, {"x": x}, name="side")
    after = b.call(str, {"x": x}, name="after")
    b.after(side, after)  # pinned order from a guarded node
    free = b.call(str, {"x": x}, name="free")
    b.output(v=free)
    g = b.build()
    gs = GraphScheduler()
    [c, f] = _submit(gs, g, {"x": 1})
    assert (c.node.id, f.node.id) == ("condition", "free")
    # `side` is skipped (branch 1 not taken); `after` was only ordered after it, so it
    # runs (a module chained after a branch must not vanish with the untaken branch).
    [run_after] = gs.handle(_done("q1", "condition", branch=0))
    assert gs.state("q1", "side") == NodeState.SKIPPED
    assert run_after.node.id == "after"
    assert gs.handle(_done("q1", "after", value="1")) == []
    assert gs.handle(_done("q1", "free", value="1")) == [QueryDone(query_id="q1", outputs={"v": "1"})]


def test_an_output_whose_input_is_skipped_is_skipped_and_the_result_is_empty() -> None:
    b = GraphBuilder("skipout")
    x = b.input("x")
    cond = b.condition(x, lambda v: 1, branches=2)
    with b.branch(cond, 0):
        only = b.call(str, {"x": x}, name="only")
    b.output(v=only)
    gs = GraphScheduler()
    _submit(gs, b.build(), {"x": 1})
    assert gs.handle(_done("q1", "condition", branch=1)) == [QueryDone(query_id="q1", outputs={})]


def test_stage_slices_are_applied_to_dispatched_inputs() -> None:
    b = GraphBuilder("stages")
    docs = b.input("docs", PortType.TEXTS)
    parts = [b.embed(docs[i : i + 2], engine="emb", items=2) for i in (0, 2, 4)]
    b.output(v=b.aggregate(parts, MergeMode.CONCAT))
    g = b.build()
    gs = GraphScheduler()
    actions = _submit(gs, g, {"docs": list("abcde")})
    assert [a.inputs for a in actions] == [{"texts": ["a", "b"]}, {"texts": ["c", "d"]}, {"texts": ["e"]}]
    assert [a.depth for a in actions] == [3.0, 3.0, 3.0]


def test_roots_without_inputs_are_dispatched_at_submission() -> None:
    b = GraphBuilder("root")
    c = b.call(lambda: 42, {}, name="const")
    b.output(v=c)
    g = b.build()
    gs = GraphScheduler()
    assert _submit(gs, g, {}) == [Dispatch(query_id="q1", node=g.nodes["const"], inputs={}, depth=2.0, arrival=0.0)]


def test_a_missing_input_fails_the_query_naming_the_field_and_dispatches_nothing() -> None:
    gs = GraphScheduler()
    [failed] = _submit(gs, _fan(), {})
    assert isinstance(failed, QueryFailed) and failed.query_id == "q1"
    assert isinstance(failed.error, GraphError)
    assert "query input 'q' is missing" in str(failed.error)
    assert "q1" not in gs


def test_a_failed_node_fails_only_its_query_names_the_primitive_and_cancels_the_rest() -> None:
    g = _fan()
    gs = GraphScheduler()
    _submit(gs, g, {"q": "x"}, qid="q1")
    _submit(gs, g, {"q": "y"}, qid="q2")
    boom = ValueError("boom")
    failed, cancel = gs.handle(NodeFailed(query_id="q1", node_id="a", error=boom, now=2.0))
    assert cancel == CancelNodes(query_id="q1", node_ids=("b",))
    assert isinstance(failed, QueryFailed) and isinstance(failed.error, PrimitiveError)
    assert failed.error.__cause__ is boom and failed.error.error is boom
    assert str(failed.error) == f"query q1: primitive {g.nodes['a'].describe()} failed: ValueError: boom"
    # Late results of the failed query are dropped; q2 is untouched.
    assert gs.handle(_done("q1", "b", value="x")) == []
    assert gs.queries == ("q2",)
    gs.handle(_done("q2", "a", value="Y"))
    [join] = gs.handle(_done("q2", "b", value="y"))
    assert gs.handle(_done("q2", join.node.id, value="Yy")) == [QueryDone(query_id="q2", outputs={"v": "Yy"})]


def test_cancel_returns_the_dispatched_nodes_and_forgets_the_query() -> None:
    gs = GraphScheduler()
    _submit(gs, _fan(), {"q": "x"})
    gs.handle(NodeStarted(query_id="q1", node_id="a", now=0.5))
    assert gs.state("q1", "a") == NodeState.RUNNING
    assert gs.handle(QueryCancelRequested(query_id="q1", now=1.0)) == [CancelNodes(query_id="q1", node_ids=("a", "b"))]
    assert "q1" not in gs
    assert gs.handle(_done("q1", "a", value="X")) == []


def test_invalid_transitions_raise_with_the_node_story() -> None:
    gs = GraphScheduler()
    _submit(gs, _fan(), {"q": "x"})
    gs.handle(_done("q1", "a", now=1.0, value="X"))
    with pytest.raises(InvalidTransition, match=r"node 'a' in state done cannot become done") as info:
        gs.handle(_done("q1", "a", now=2.0, value="X"))
    assert [(t.start, t.finish) for t in info.value.story] == [
        (NodeState.WAITING, NodeState.READY),
        (NodeState.READY, NodeState.DONE),
    ]
    assert "inputs ready" in str(info.value) and "finished" in str(info.value)
    with pytest.raises(InvalidTransition, match=r"'join' in state waiting cannot become running"):
        gs.handle(NodeStarted(query_id="q1", node_id="join", now=3.0))
    with pytest.raises(InvalidTransition, match="unknown to the query"):
        gs.handle(_done("q1", "nope"))


def test_submitting_a_running_query_id_twice_is_an_error() -> None:
    gs = GraphScheduler()
    _submit(gs, _fan(), {"q": "x"})
    with pytest.raises(SchedulerError, match="already running"):
        _submit(gs, _fan(), {"q": "x"})


def test_many_queries_share_one_plan_per_graph() -> None:
    g = _chain()
    gs = GraphScheduler()
    for i in range(50):
        _submit(gs, g, {"q": [str(i)]}, qid=f"q{i}")
    assert len(gs._plans) == 1
    for i in reversed(range(50)):
        [fmt] = gs.handle(_done(f"q{i}", "embed", vectors=[i]))
        assert fmt.inputs == {"v": [i]}
        [done] = gs.handle(_done(f"q{i}", "format", prompt=str(i)))
        assert done == QueryDone(query_id=f"q{i}", outputs={"prompt": str(i)})
    assert gs.queries == ()


def test_partial_decode_nodes_are_dispatched_like_any_other() -> None:
    b = GraphBuilder("pd")
    q = b.input("q")
    prompt = b.format("{q}", q=q)
    kv = b.add(PrimitiveKind.PREFILL, {"prompt": prompt}, engine="llm")
    pds = [
        b.add(
            PrimitiveKind.PARTIAL_DECODE,
            {"kv": Value(kv.id, "kv")},
            engine="llm",
            config={"split_unit": Lines()},
            part=DecodePart("g", i, 2),
            input_ports=(PortSpec("kv", PortType.KV),),
            output_ports=(PortSpec("items", PortType.ITEMS),),
            name=f"pd{i}",
        )
        for i in range(2)
    ]
    b.output(a=Value(pds[0].id, "items"), b=Value(pds[1].id, "items"))
    g = b.build()
    gs = GraphScheduler()
    [fmt] = _submit(gs, g, {"q": "hi"})
    [pre] = gs.handle(_done("q1", fmt.node.id, prompt="hi"))
    pd0, pd1 = gs.handle(_done("q1", pre.node.id, kv="KV"))
    assert (pd0.node.id, pd1.node.id) == ("pd0", "pd1") and pd0.inputs == pd1.inputs == {"kv": "KV"}


def test_control_edges_count_like_data_edges() -> None:
    # b waits for a through an order-only edge although it needs none of a's data.
    b = GraphBuilder("order")
    q = b.input("q")
    a = b.call(str, {"q": q}, name="a")
    c = b.call(str, {"q": q}, name="b")
    b.after(a, c)
    b.output(a=a, b=c)
    g = b.build()
    assert ControlEdge("a", "b", pinned=True) in g.control_edges
    gs = GraphScheduler()
    [first] = _submit(gs, g, {"q": 1})
    assert first.node.id == "a"
    [second] = gs.handle(_done("q1", "a", value="1"))
    assert second.node.id == "b" and second.inputs == {"q": 1}
