"""RetrieverQueryEngine through Teola (llama-index-core 0.12 and 0.14): same answers."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from drop_in_family import check_drop_in
from li_fakes import TEXTS, make_index, make_llm
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.postprocessor import SimilarityPostprocessor
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.response_synthesizers import get_response_synthesizer
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

import teola
from teola_core.ir.kinds import PrimitiveKind
from teola_llamaindex import OpaqueModuleWarning, TeolaQueryEngine

INDEX = make_index()


class KeywordRetriever(BaseRetriever):
    """A retriever Teola does not decompose (runs as one call)."""

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        words = set(query_bundle.query_str.lower().split())
        hits = [t for t in TEXTS if words & set(t.lower().split())]
        return [NodeWithScore(node=TextNode(text=t, id_=f"k{i}"), score=1.0) for i, t in enumerate(hits)]


def _engine(**kwargs: Any) -> Callable[[], RetrieverQueryEngine]:
    def build() -> RetrieverQueryEngine:
        return INDEX.as_query_engine(llm=make_llm(max_tokens=None), **kwargs)

    return build


def _keyword() -> RetrieverQueryEngine:
    return RetrieverQueryEngine.from_args(KeywordRetriever(), llm=make_llm(max_tokens=None))


def _postprocessed() -> RetrieverQueryEngine:
    return RetrieverQueryEngine(
        retriever=INDEX.as_retriever(similarity_top_k=4),
        response_synthesizer=get_response_synthesizer(llm=make_llm(max_tokens=None), response_mode="refine"),
        node_postprocessors=[SimilarityPostprocessor(similarity_cutoff=0.5)],
    )


SHAPES: dict[str, Callable[[], RetrieverQueryEngine]] = {
    "default-compact": _engine(),
    "refine": _engine(response_mode="refine", similarity_top_k=3),
    "tree-summarize": _engine(response_mode="tree_summarize"),
    "top-k-1": _engine(similarity_top_k=1),
    "simple-summarize": _engine(response_mode="simple_summarize"),
    "postprocessor-refine": _postprocessed,
    "opaque-retriever": _keyword,
}


def _same(a: Any, b: Any) -> None:
    assert str(a) == str(b)
    assert [(n.node.node_id, n.score) for n in a.source_nodes] == [(n.node.node_id, n.score) for n in b.source_nodes]
    assert a.metadata == b.metadata


@pytest.mark.parametrize("decompose", [False, None, True])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("query", ["what do cats do?", "refine mode chunk"])
def test_query_equal_sync_and_async(shape: str, query: str, decompose: bool | None) -> None:
    engine = SHAPES[shape]()
    fast = teola.optimize(engine, decompose=decompose)
    assert isinstance(fast, TeolaQueryEngine)
    expected = engine.query(query)
    _same(fast.query(query), expected)
    _same(asyncio.run(fast.aquery(query)), expected)
    _same(asyncio.run(engine.aquery(query)), expected)
    fast.close()


@pytest.mark.parametrize("decompose", [False, None, True])
def test_query_bundle_gets_its_embedding_as_in_sync_llamaindex(decompose: bool | None) -> None:
    engine = _engine()()
    fast = TeolaQueryEngine(engine, decompose=decompose)
    ours, theirs = QueryBundle("dogs"), QueryBundle("dogs")
    _same(fast.query(ours), engine.query(theirs))
    assert ours.embedding == theirs.embedding and ours.embedding is not None


def test_a_vector_retriever_is_embed_and_search_unless_decompose_is_false() -> None:
    for options in ({}, {"decompose": True}):
        kinds = [n.kind for n in TeolaQueryEngine(_engine()(), **options).pgraph.nodes.values()]
        assert PrimitiveKind.EMBED in kinds and PrimitiveKind.SEARCH in kinds
    kinds = [n.kind for n in TeolaQueryEngine(_engine()(), decompose=False).pgraph.nodes.values()]
    assert PrimitiveKind.SEARCH in kinds and PrimitiveKind.EMBED not in kinds
    kinds = [n.kind for n in TeolaQueryEngine(_keyword()).pgraph.nodes.values()]  # any other retriever: one call
    assert PrimitiveKind.SEARCH in kinds and PrimitiveKind.EMBED not in kinds


def test_concurrent_queries_embed_each_query_alone() -> None:
    """One call per batch: a joint query-embedding call does not exist in LlamaIndex."""
    engine = _engine()()
    fast = TeolaQueryEngine(engine)
    sizes: list[int] = []

    class Hook:
        def on_span(self, span: Any) -> None:
            if span.node.kind == PrimitiveKind.EMBED:
                sizes.append(span.batch_size)

    async def main() -> list[Any]:
        fast.runtime().add_hook(Hook())
        return await asyncio.gather(*(fast.aquery(f"question {i}") for i in range(5)))

    for got, i in zip(asyncio.run(main()), range(5), strict=True):
        _same(got, engine.query(f"question {i}"))
    assert sizes == [1] * 5


def test_synthesizer_error_is_the_users_exception() -> None:
    class Boom(SimilarityPostprocessor):
        def _postprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None) -> Any:
            raise RuntimeError("boom")

    engine = RetrieverQueryEngine.from_args(
        INDEX.as_retriever(), llm=make_llm(max_tokens=None), node_postprocessors=[Boom()]
    )
    fast = TeolaQueryEngine(engine)
    with pytest.raises(RuntimeError, match="boom") as info:
        fast.query("x")
    assert any("postprocessor0:Boom" in note for note in info.value.__notes__)
    with pytest.raises(RuntimeError, match="boom"):
        asyncio.run(fast.aquery("x"))


def test_subclass_runs_as_itself_as_one_step_with_one_warning() -> None:
    class Custom(RetrieverQueryEngine):
        def _query(self, query_bundle: QueryBundle) -> Any:
            return super()._query(QueryBundle(query_bundle.query_str + " (custom)"))

    engine = Custom(retriever=INDEX.as_retriever(), response_synthesizer=get_response_synthesizer(llm=make_llm()))
    with pytest.warns(OpaqueModuleWarning, match="Custom runs as itself"):
        fast = TeolaQueryEngine(engine)
    _same(fast.query("dogs"), engine.query("dogs"))
    _same(asyncio.run(fast.aquery("dogs")), asyncio.run(engine.aquery("dogs")))
    assert "(custom)" in str(fast.query("dogs")) and fast.calls_on_graph == 3


def test_explain_shows_the_plan_in_mermaid_and_what_recent_queries_did(tmp_path: Any) -> None:
    fast = teola.optimize(_engine()())
    try:
        before = fast.explain()
        assert "== mermaid query ==\nflowchart TD" in before and "none recorded yet" in before
        fast.query("What is Teola?")
        after = fast.explain(png_dir=tmp_path)
        assert "1 queries" in after  # one query's timed primitives, per engine and kind
        assert (tmp_path / "query-egraph.png").stat().st_size > 0
        assert (tmp_path / "timeline.png").stat().st_size > 0
    finally:
        fast.close()


@pytest.mark.parametrize("shape", ["default-compact", "opaque-retriever"])
def test_a_query_engine_is_on_the_drop_in_kit(shape: str) -> None:
    """The query engine row of the drop-in family (`tests/drop_in_family.py`), traced and as itself."""
    engine = SHAPES[shape]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OpaqueModuleWarning)
        fast = teola.optimize(engine)

    async def run(app: Any) -> str:
        return str(await app.aquery("what do cats eat?"))

    asyncio.run(check_drop_in(engine, fast, run))
