"""Dependency pruning: module order no data needs is dropped; guards and pinned order stay."""

from __future__ import annotations

from teola_core.ir.builder import GraphBuilder
from teola_core.ir.graph import Graph
from teola_core.ir.node import ControlEdge
from teola_core.ir.types import PortType
from teola_core.passes import DependencyPruning, PassContext


def _graph() -> Graph:
    """Three modules: `second` needs nothing from `first`; `third` is guarded and pinned."""
    b = GraphBuilder("pruning")
    q = b.input("q", PortType.TEXT)
    with b.module("first"):
        a = b.call(str.upper, {"q": q}, name="a", inline=True)
    with b.module("second"):
        c = b.call(str.lower, {"q": q}, name="c", inline=True)
        cond = b.condition(c, lambda v: 0, branches=2)
    with b.module("third"), b.branch(cond, 0):
        d = b.call(str.title, {"q": a}, name="d", inline=True)
    b.after(c, d)
    b.output(a=a, d=d)
    return b.build()


def test_drops_module_order_and_keeps_guards_and_pinned_edges() -> None:
    g = _graph()
    assert set(g.control_edges) == {
        ControlEdge("first.a", "second.c"),
        ControlEdge("second.condition", "third.d", branch=0),
        ControlEdge("second.c", "third.d", pinned=True),
        ControlEdge("second.condition", "third.d"),
    }
    out = DependencyPruning().run(g, PassContext())
    assert set(out.control_edges) == {
        ControlEdge("second.condition", "third.d", branch=0),
        ControlEdge("second.c", "third.d", pinned=True),
    }
    assert out.data_edges == g.data_edges
    assert list(out.nodes) == list(g.nodes)
    assert out.notes == (
        "dependency-pruning: dropped order edge first.a -> second.c (no data flows along it)",
        "dependency-pruning: dropped order edge second.condition -> third.d (no data flows along it)",
    )
    # the input graph is untouched
    assert len(g.control_edges) == 4 and g.notes == ()


def test_independent_modules_become_parallel() -> None:
    g = _graph()
    out = DependencyPruning().run(g, PassContext())
    assert "first.a" in g.predecessors("second.c")
    assert out.predecessors("second.c") == {"input.q"}


def test_nothing_to_prune_returns_the_same_graph() -> None:
    g = DependencyPruning().run(_graph(), PassContext())
    assert DependencyPruning().run(g, PassContext()) is g
