"""Pass manager: order, on/off by name, user passes, fixed point, failures named."""

from __future__ import annotations

from dataclasses import replace

import pytest
from toy_engines import meb_profile

from teola_core.ir.builder import GraphBuilder
from teola_core.ir.errors import GraphError, PassError
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import PortSpec
from teola_core.ir.node import DataEdge
from teola_core.ir.split_units import Lines
from teola_core.ir.types import PortType
from teola_core.passes import (
    DecodePipelining,
    DependencyPruning,
    Pass,
    PassContext,
    PassManager,
    PrefillSplit,
    RerankPrescoring,
    StageDecomposition,
    default_passes,
)

CTX = PassContext(profiles={"embedder": meb_profile("embedder", embed=2)})


def _graph() -> Graph:
    b = GraphBuilder("managed")
    q = b.input("q", PortType.TEXT)
    docs = b.input("docs", PortType.TEXTS)
    with b.module("index"):
        vectors = b.embed(docs, engine="embedder", items=4)
    with b.module("expand"):
        out = b.llm(b.format("Queries for {q}", q=q), engine="llm", max_tokens=8, split_unit=Lines(), expected_items=2)
    b.output(vectors=vectors, queries=out.items)
    return b.build()


class Relabel(Pass):
    """Renames the graph once: a well-behaved user pass."""

    name = "relabel"

    def run(self, graph: Graph, ctx: PassContext) -> Graph:
        if graph.name == "relabelled":
            return graph
        editor = graph.edit()
        editor.name = "relabelled"
        editor.note("relabel: renamed the graph")
        return editor.freeze()


class Broken(Pass):
    name = "broken"

    def run(self, graph: Graph, ctx: PassContext) -> Graph:
        raise RuntimeError("boom")


class Dangling(Pass):
    """Leaves an input port without a producer."""

    name = "dangling"

    def run(self, graph: Graph, ctx: PassContext) -> Graph:
        editor = graph.edit()
        editor.disconnect(next(e for e in graph.data_edges if e.dst == graph.output_node.id))
        return editor.freeze()


class NewOutput(Pass):
    """Adds an output port: the outputs must never change."""

    name = "new-output"

    def run(self, graph: Graph, ctx: PassContext) -> Graph:
        editor = graph.edit()
        out = graph.output_node
        editor.replace_node(replace(out, inputs=(*out.inputs, PortSpec("extra", PortType.ANY))))
        editor.connect(DataEdge("input.q", "value", out.id, "extra"))
        return editor.freeze()


class Restless(Pass):
    """Returns a new (equal) graph every time: never reaches a fixed point."""

    name = "restless"

    def run(self, graph: Graph, ctx: PassContext) -> Graph:
        return graph.edit().freeze()


class NotAGraph(Pass):
    name = "not-a-graph"

    def run(self, graph: Graph, ctx: PassContext) -> Graph:
        return None  # type: ignore[return-value]


def test_default_pipeline_order_and_types() -> None:
    assert PassManager().names == (
        "dependency-pruning",
        "rerank-prescoring",
        "stage-decomposition",
        "prefill-split",
        "decode-pipelining",
    )
    assert [type(p) for p in default_passes()] == [
        DependencyPruning,
        RerankPrescoring,
        StageDecomposition,
        PrefillSplit,
        DecodePipelining,
    ]


def test_runs_to_a_fixed_point_and_reports_what_changed() -> None:
    g = _graph()
    result = PassManager().optimize(g, CTX)
    assert result.p_graph is g
    assert result.applied == ("dependency-pruning", "stage-decomposition", "decode-pipelining")
    assert result.rounds == 2  # one round of rewrites, one that changes nothing
    assert len(result.notes) == 3 and result.notes == result.e_graph.notes
    stages = {"index.embed/s0", "index.embed/s1", "expand.llm.decode/p0", "expand.llm.decode/p1"}
    assert stages <= set(result.e_graph.nodes)
    again = PassManager().optimize(result.e_graph, CTX)
    assert again.e_graph is result.e_graph and again.applied == () and again.rounds == 1


def test_passes_can_be_switched_off_by_name() -> None:
    manager = PassManager(disabled=["stage-decomposition"]).disable("decode-pipelining")
    assert manager.enabled == ("dependency-pruning", "rerank-prescoring", "prefill-split")
    result = manager.optimize(_graph(), CTX)
    assert result.applied == ("dependency-pruning",)
    manager.enable("decode-pipelining")
    assert manager.optimize(_graph(), CTX).applied == ("dependency-pruning", "decode-pipelining")
    with pytest.raises(KeyError, match="no pass named 'nope'"):
        manager.disable("nope")


def test_user_passes_are_registered_in_position() -> None:
    manager = PassManager().register(Relabel(), before="rerank-prescoring")
    assert manager.names[:3] == ("dependency-pruning", "relabel", "rerank-prescoring")
    result = manager.optimize(_graph(), CTX)
    assert result.e_graph.name == "relabelled"
    assert result.applied[:2] == ("dependency-pruning", "relabel")
    assert PassManager([]).register(Relabel()).names == ("relabel",)
    assert PassManager().register(Relabel(), after="dependency-pruning").names[1] == "relabel"
    with pytest.raises(ValueError, match="already registered"):
        manager.register(Relabel())


def test_a_failing_pass_is_named_and_chained() -> None:
    with pytest.raises(PassError, match=r"pass 'broken': failed: RuntimeError: boom") as info:
        PassManager().register(Broken()).optimize(_graph(), CTX)
    assert info.value.pass_name == "broken"
    assert isinstance(info.value.__cause__, RuntimeError)


def test_an_invalid_result_is_named_and_chained() -> None:
    with pytest.raises(PassError, match=r"pass 'dangling': left an invalid graph: .*has no producer") as info:
        PassManager([Dangling()]).optimize(_graph(), CTX)
    assert isinstance(info.value.__cause__, GraphError)


def test_changing_the_outputs_is_refused() -> None:
    with pytest.raises(PassError, match=r"pass 'new-output': changed the output node"):
        PassManager([NewOutput()]).optimize(_graph(), CTX)


def test_a_pass_that_never_settles_is_named() -> None:
    with pytest.raises(PassError, match=r"pass 'restless': graph still changing after 3 rounds"):
        PassManager([Relabel(), Restless()], max_rounds=3).optimize(_graph(), CTX)


def test_a_pass_must_return_a_graph() -> None:
    with pytest.raises(PassError, match=r"pass 'not-a-graph': returned NoneType"):
        PassManager([NotAGraph()]).optimize(_graph(), CTX)


def test_an_invalid_input_graph_is_a_graph_error_not_a_pass_error() -> None:
    g = _graph()
    editor = g.edit()
    editor.disconnect(next(e for e in g.data_edges if e.dst == "output"))
    with pytest.raises(GraphError, match="has no producer"):
        PassManager().optimize(editor.freeze(), CTX)
