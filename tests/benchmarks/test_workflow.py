"""Workflow templates (the benchmark workloads' modules) shape a p-graph per query."""

from __future__ import annotations

import pytest

from teola_benchmarks.workflow import Module, ModuleEnv, WorkflowTemplate
from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.errors import GraphError
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.types import PortType


def _indexing(b: GraphBuilder, env: ModuleEnv) -> dict[str, Value]:
    docs = env["docs"]
    vectors = b.embed(docs, engine="embedder", items=len(env.query["docs"]))
    return {"index": b.ingest(docs, vectors, engine="vectordb", items=len(env.query["docs"]), collection="c")}


def _per_query(b: GraphBuilder, env: ModuleEnv) -> dict[str, Value]:
    parts = [b.call(str.upper, {"q": env["questions"][i : i + 1]}, name=f"q{i}") for i in range(env.query["n"])]
    return {"answers": b.call(lambda **kw: list(kw.values()), {f"p{i}": p for i, p in enumerate(parts)}, name="join")}


TEMPLATE = WorkflowTemplate(
    "t",
    inputs={"docs": PortType.TEXTS, "questions": PortType.TEXTS, "n": PortType.ANY},
    modules=[Module("indexing", _indexing), Module("answer", _per_query)],
    outputs=("index", "answers"),
)


def test_graph_shape_depends_on_the_query() -> None:
    small = TEMPLATE.instantiate({"docs": ["a"] * 3, "questions": ["x"], "n": 1})
    large = TEMPLATE.instantiate({"docs": ["a"] * 40, "questions": ["x", "y", "z"], "n": 3})
    assert small.nodes["indexing.embed"].items == 3 and large.nodes["indexing.embed"].items == 40
    calls = [n for n in large.nodes.values() if n.kind == PrimitiveKind.CALL]
    assert len(calls) == 4 and len([n for n in small.nodes.values() if n.kind == PrimitiveKind.CALL]) == 2
    assert small.nodes["input.docs"].items == 3


def test_missing_and_unknown_query_fields_are_named() -> None:
    with pytest.raises(GraphError, match=r"missing input field\(s\) \['n'\]"):
        TEMPLATE.instantiate({"docs": [], "questions": []})
    with pytest.raises(GraphError, match=r"unknown query field\(s\) \['extra'\]"):
        TEMPLATE.instantiate({"docs": [], "questions": [], "n": 0, "extra": 1})
