"""IR: builder, validation errors that name node and port, depths, module chaining."""

from __future__ import annotations

import asyncio

import pytest

from teola_core.engines.protocol import EngineSet
from teola_core.ir.builder import GraphBuilder
from teola_core.ir.errors import GraphError
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import Capabilities, MergeMode, PortSpec, PrimitiveKind
from teola_core.ir.node import ControlEdge, DataEdge, Node
from teola_core.ir.split_units import Lines
from teola_core.ir.types import PortType, compatible
from teola_core.runtime.reference import evaluate


def _two_modules() -> Graph:
    b = GraphBuilder("two")
    q = b.input("q", PortType.TEXT)
    with b.module("first"):
        a = b.call(str.upper, {"q": q}, inline=True)
    with b.module("second"):
        c = b.call(str.lower, {"q": q}, inline=True)
    b.output(a=a, c=c)
    return b.build()


def test_modules_are_chained_by_prunable_control_edges() -> None:
    g = _two_modules()
    assert g.control_edges == (ControlEdge("first.call", "second.call"),)
    assert g.control_edges[0].prunable


def test_pinned_order_is_not_prunable() -> None:
    b = GraphBuilder()
    q = b.input("q")
    a = b.call(str.upper, {"q": q})
    c = b.call(str.lower, {"q": q})
    b.after(a, c)
    b.output(a=a, c=c)
    (edge,) = b.build().control_edges
    assert edge.pinned and not edge.prunable


def test_depth_is_longest_path_to_output_not_topological_index() -> None:
    # q -> long1 -> long2 -> out ; q -> short -> out: short's depth is 2, not its index.
    b = GraphBuilder()
    q = b.input("q")
    l1 = b.call(str.upper, {"q": q}, name="long1")
    l2 = b.call(str.upper, {"q": l1}, name="long2")
    s = b.call(str.lower, {"q": q}, name="short")
    b.output(a=l2, b=s)
    depths = b.build().depths()
    assert depths["long1"] == 3 and depths["long2"] == 2 and depths["short"] == 2
    assert depths["input.q"] == 4
    weighted = b.build().depths(lambda n: 10.0 if n.id == "short" else 1.0)
    assert weighted["input.q"] == 12.0


def test_missing_producer_names_node_and_port() -> None:
    node = Node("lonely", PrimitiveKind.EMBED, (PortSpec("texts", PortType.TEXTS),), (), engine="e")
    out = Node("output", PrimitiveKind.OUTPUT, (), ())
    with pytest.raises(GraphError, match=r"lonely\.texts has no producer"):
        from teola_core.ir.validate import validate

        validate(Graph({"lonely": node, "output": out}))


def test_type_mismatch_names_both_ports() -> None:
    b = GraphBuilder("typed")
    idx = b.input("index", PortType.INDEX)
    b.embed(idx, engine="embedder")
    b.output()
    with pytest.raises(
        GraphError, match=r"type mismatch on embed\.texts.*list\[text\].*input\.index\.value produces index"
    ):
        b.build()


def test_cycle_is_named() -> None:
    a = Node(
        "a", PrimitiveKind.CALL, (PortSpec("x", PortType.ANY),), (PortSpec("value", PortType.ANY),), config={"fn": str}
    )
    c = Node(
        "c", PrimitiveKind.CALL, (PortSpec("x", PortType.ANY),), (PortSpec("value", PortType.ANY),), config={"fn": str}
    )
    out = Node("output", PrimitiveKind.OUTPUT, (PortSpec("v", PortType.ANY),), ())
    edges = (DataEdge("a", "value", "c", "x"), DataEdge("c", "value", "a", "x"), DataEdge("c", "value", "output", "v"))
    from teola_core.ir.validate import validate

    with pytest.raises(GraphError, match=r"cycle: (a -> c -> a|c -> a -> c)"):
        validate(Graph({"a": a, "c": c, "output": out}, edges))


def test_two_producers_for_one_port_is_an_error() -> None:
    b = GraphBuilder("dup")
    q = b.input("q")
    r = b.input("r")
    node = b.call(str.upper, {"q": q})
    b.output(v=node)
    g = b.build(chain_modules=False)
    editor = g.edit()
    editor.connect(DataEdge(r.node, r.port, node.node, "q"))
    from teola_core.ir.validate import validate

    with pytest.raises(GraphError, match=r"call\.q has 2 producers"):
        validate(editor.freeze())


def test_engine_primitive_without_engine_is_rejected() -> None:
    from teola_core.ir.validate import validate

    b = GraphBuilder("noengine")
    t = b.input("t", PortType.TEXTS)
    v = b.embed(t, engine="")
    b.output(v=v)
    with pytest.raises(GraphError, match="names no engine"):
        validate(b._editor.freeze())


def test_decode_with_split_unit_declares_items_and_is_splittable() -> None:
    b = GraphBuilder()
    p = b.format("List {n} things", n=b.input("n"))
    out = b.llm(p, engine="llm", max_tokens=10, split_unit=Lines(), expected_items=3)
    b.output(items=out.items)
    g = b.build()
    decode = g.nodes[out.text.node]
    assert decode.output_port("items") is not None
    assert decode.caps == Capabilities(True, True, (), "items", MergeMode.CONCAT)
    assert decode.items == 3 and decode.config["split_unit"] == Lines()


def test_engines_can_narrow_capabilities() -> None:
    b = GraphBuilder(caps_for=lambda engine, kind, caps: caps.narrowed(batchable=False))
    t = b.input("t", PortType.TEXTS)
    v = b.embed(t, engine="embedder", items=5)
    b.output(v=v)
    caps = b.build().nodes[v.node].caps
    assert not caps.batchable and caps.splittable


def test_items_list_type_is_compatible_with_list_types_only() -> None:
    assert compatible(PortType.ITEMS, PortType.TEXTS)
    assert not compatible(PortType.ITEMS, PortType.INDEX)
    assert not compatible(PortType.TEXTS, PortType.VECTORS)


def test_condition_runs_one_branch_and_select_joins() -> None:
    b = GraphBuilder("branchy")
    x = b.input("x")
    cond = b.condition(x, lambda v: 0 if v > 0 else 1, branches=2)
    with b.branch(cond, 0):
        pos = b.call(lambda x: f"pos {x}", {"x": x}, name="pos")
    with b.branch(cond, 1):
        neg = b.call(lambda x: f"neg {x}", {"x": x}, name="neg")
    out = b.aggregate([pos, neg], MergeMode.SELECT)
    b.output(v=out)
    g = b.build()
    assert asyncio.run(evaluate(g, {"x": 3}, EngineSet())) == {"v": "pos 3"}
    assert asyncio.run(evaluate(g, {"x": -1}, EngineSet())) == {"v": "neg -1"}


def test_missing_query_input_names_the_field() -> None:
    g = _two_modules()
    with pytest.raises(GraphError, match="query input 'q' is missing"):
        asyncio.run(evaluate(g, {}, EngineSet()))


def test_a_module_chained_after_a_branch_still_runs() -> None:
    """Order edges from an untaken branch order; they do not skip the next module."""
    from teola_core.passes import PassManager

    b = GraphBuilder("route")
    x = b.input("x")
    with b.module("route"):
        cond = b.condition(x, lambda v: 0 if v == "a" else 1, branches=2)
        with b.branch(cond, 0):
            left = b.call(lambda x: f"zero:{x}", {"x": x}, name="left", inline=True)
        with b.branch(cond, 1):
            right = b.call(lambda x: f"one:{x}", {"x": x}, name="right", inline=True)
    with b.module("next"):
        joined = b.aggregate([left, right], MergeMode.SELECT)
        z = b.call(lambda x: x.upper(), {"x": joined}, name="z", inline=True)
    b.output(z=z)
    p_graph = b.build()
    e_graph = PassManager().optimize(p_graph).e_graph
    for value, expected in (("a", "ZERO:A"), ("b", "ONE:B")):
        assert asyncio.run(evaluate(p_graph, {"x": value}, EngineSet())) == {"z": expected}
        assert asyncio.run(evaluate(e_graph, {"x": value}, EngineSet())) == {"z": expected}
