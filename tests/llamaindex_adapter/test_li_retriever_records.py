"""A `VectorIndexRetriever` runs as EMBED + SEARCH by default, and records what plain records.

Its `retrieve` / `aretrieve` span, `RetrievalStartEvent` / `RetrievalEndEvent`, the legacy
RETRIEVE callback event in its "query" trace, `_retrieve`'s span and the embedding's spans,
events and EMBEDDING callback events, with their arguments, results and payloads (ids and
times aside): equal to plain, sync and async, for queries one by one and concurrent, and
when the embedding or the search raises. Records: `li_trace` with `details=True`, and a
`LlamaDebugHandler`'s event pairs and trace map.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any

import pytest
from li_fakes import TEXTS, HashEmbedding, make_llm, recursive_retriever
from li_trace import CallbackRecorder, Recorder, canonical, summary
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.callbacks import CallbackManager, LlamaDebugHandler
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import QueryBundle, TextNode
from llama_index.core.vector_stores import SimpleVectorStore

import teola
from teola_core.engines.protocol import Call, PerCallEngine
from teola_core.ir.kinds import PrimitiveKind
from teola_llamaindex import TeolaQueryEngine

QUESTIONS = ["what do cats do at dusk?", "where do dogs come from?", "what is teola?", "vector stores"]


class BoomEmbedding(HashEmbedding):
    """Embeds, except a query that says "boom"."""

    def _vec(self, text: str) -> list[float]:
        if "boom" in text:
            raise RuntimeError(f"cannot embed {text!r}")
        return super()._vec(text)


class BoomStore(SimpleVectorStore):
    """A vector store whose searches fail when the query says "boom" (`aquery` runs `query`)."""

    def query(self, query: Any, **kwargs: Any) -> Any:
        if query.query_str and "boom" in query.query_str:
            raise ValueError("the store is down")
        return super().query(query, **kwargs)


class Records:
    """Where a query engine reports: spans and events (`Recorder`), and its callback manager's
    handlers, set on the engine, the retriever and the embed model."""

    def __init__(self) -> None:
        self.callbacks = CallbackRecorder(details=True)
        self.debug = LlamaDebugHandler(print_trace_on_end=False)
        self.manager = CallbackManager([self.callbacks, self.debug])

    def engine(self, *, store: Any = None, embed: type[HashEmbedding] = BoomEmbedding) -> RetrieverQueryEngine:
        storage = StorageContext.from_defaults(vector_store=store) if store is not None else None
        index = VectorStoreIndex(
            [TextNode(text=t, id_=f"n{i}") for i, t in enumerate(TEXTS)],
            embed_model=embed(embed_dim=8, callback_manager=self.manager),
            storage_context=storage,
        )
        retriever = index.as_retriever(similarity_top_k=2)
        retriever.callback_manager = self.manager
        return RetrieverQueryEngine.from_args(retriever, llm=make_llm(), callback_manager=self.manager)

    def run(self, call: Callable[[], Any]) -> tuple[Any, Recorder, list[Any], list[Any]]:
        """`call()`'s outcome and what it recorded (the callback log, the debug handler's pairs)."""
        self.callbacks.log = []
        self.debug.flush_event_logs()
        with Recorder(details=True) as seen:
            try:
                outcome: Any = str(call())
            except Exception as exc:
                outcome = summary(exc)
        pairs = [tuple((str(e.event_type), summary(e.payload)) for e in pair) for pair in self.debug.get_event_pairs()]
        return outcome, seen, self.callbacks.log, pairs


def _same_as_plain(
    build: Callable[[Records], Any], ask: Callable[[Any], Any], concurrent: bool = False, loose: tuple[str, ...] = ()
) -> Recorder:
    """An object plain, then through Teola: equal outcomes and records (see the module docstring).

    `loose`: spans (by name prefix) whose details are not compared (QueryPipeline's
    `run_jobs` / `worker`, whose details differ: `executor_spans`, docs/llamaindex.md).
    """
    records = Records()
    plain = build(records)
    fast = teola.optimize(plain)
    try:
        want = records.run(lambda: ask(plain))
        plain_shape = _trace_shape(records)
        got = records.run(lambda: ask(fast))
    finally:
        fast.close()
    assert got[0] == want[0]
    if concurrent:  # the order of concurrent queries' records aside
        assert canonical(_loosened(got[1].log, loose)) == canonical(_loosened(want[1].log, loose))
        assert sorted(map(_no_trace_map, got[2]), key=repr) == sorted(map(_no_trace_map, want[2]), key=repr)
        assert sorted(got[3], key=repr) == sorted(want[3], key=repr)
    else:
        assert _loosened(got[1].tree(), loose) == _loosened(want[1].tree(), loose)
        assert got[2] == want[2]
        assert got[3] == want[3]
        assert _trace_shape(records) == plain_shape
    names = {entry[1] for entry in got[1].tree()}
    retrieve = {"VectorIndexRetriever.retrieve", "VectorIndexRetriever.aretrieve"}
    assert names & retrieve and "RetrievalStartEvent" in names  # the retriever's own records are there
    assert any(entry[1] == "CBEventType.RETRIEVE" for entry in got[2])
    return got[1]


def _loosened(log: list[tuple[Any, ...]], names: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """`log` without the details of the spans named `names`."""
    keep = {"span": 4, "exit": 2, "drop": 3}
    return [e[: keep[e[0]]] if e[0] in keep and e[1].startswith(names) else e for e in log]


def _no_trace_map(entry: tuple[Any, ...]) -> tuple[Any, ...]:
    """A callback log entry without the trace map (concurrent traces share the manager's)."""
    return entry[:2] if entry[0] == "cb-end-trace" else entry


def _trace_shape(records: Records) -> Any:
    debug = records.debug
    types = {i: str(pair[0].event_type) for i, pair in debug.events_pairs_by_id.items()}
    return sorted((types.get(p, p), tuple(types.get(c, c) for c in cs)) for p, cs in debug._trace_map.items())


def _sync(question: str) -> Callable[[Any], Any]:
    return lambda engine: engine.query(question)


def _async(question: str) -> Callable[[Any], Any]:
    return lambda engine: asyncio.run(engine.aquery(question))


ASK = {"query": _sync, "aquery": _async}


# -- the graph ---------------------------------------------------------------------------


def test_by_default_a_vector_retriever_is_embed_and_search_unless_told_otherwise() -> None:
    engine = Records().engine()

    def kinds(**options: Any) -> list[PrimitiveKind]:
        fast = TeolaQueryEngine(engine, **options)
        fast.close()
        return [n.kind for n in fast.pgraph.nodes.values()]

    assert kinds().count(PrimitiveKind.EMBED) == 1 and kinds().count(PrimitiveKind.SEARCH) == 1
    assert PrimitiveKind.EMBED in kinds(decompose=True)
    assert PrimitiveKind.EMBED not in kinds(decompose=False) and PrimitiveKind.SEARCH in kinds(decompose=False)


class WholeRetrieval(PerCallEngine):
    """A user's engine for a retriever (`engines=`): a whole retrieval, as the retriever's own."""

    name = "whole"
    kinds = frozenset({PrimitiveKind.SEARCH})

    def __init__(self, retriever: Any) -> None:
        self.retriever = retriever
        self.calls = 0

    async def run_call(self, call: Call) -> dict[str, Any]:
        self.calls += 1
        return {"nodes": await self.retriever.aretrieve(call.inputs["query"])}


@pytest.mark.parametrize("how", ["pairs", "chooser"])
def test_a_retriever_given_an_engine_of_its_own_runs_whole_on_it(how: str) -> None:
    engine = Records().engine()
    whole = WholeRetrieval(engine.retriever)
    option: Any = [(engine.retriever, whole)]
    if how == "chooser":
        option = lambda component, default: whole if component is engine.retriever else None  # noqa: E731
    fast = TeolaQueryEngine(engine, engines=option)
    try:
        assert PrimitiveKind.EMBED not in [n.kind for n in fast.pgraph.nodes.values()]
        assert str(fast.query(QUESTIONS[0])) == str(engine.query(QUESTIONS[0])) and whole.calls == 1
    finally:
        fast.close()


# -- records, one query at a time ----------------------------------------------------------


@pytest.mark.parametrize("api", list(ASK))
@pytest.mark.parametrize("bundle", [False, True], ids=["str", "bundle"])
def test_a_query_records_what_plain_records(api: str, bundle: bool) -> None:
    def ask(engine: Any) -> Any:  # a fresh bundle each time: the sync path stores the embedding on it
        return ASK[api](QueryBundle(QUESTIONS[1]) if bundle else QUESTIONS[0])(engine)

    tree = _same_as_plain(lambda r: r.engine(), ask).tree()
    method, query = ("retrieve", "_query") if api == "query" else ("aretrieve", "_aquery")
    spans = [(e[1], e[3]) for e in tree if e[0] == "span"]
    assert (f"VectorIndexRetriever.{method}", f"RetrieverQueryEngine.{query}") in spans
    assert (f"VectorIndexRetriever._{method}", f"VectorIndexRetriever.{method}") in spans
    embed = "get_query_embedding" if api == "query" else "aget_query_embedding"
    assert (f"BoomEmbedding.{embed}", f"VectorIndexRetriever._{method}") in spans


def test_a_sync_query_from_async_code_records_what_plain_records() -> None:
    async def ask(engine: Any) -> Any:
        return engine.query(QUESTIONS[2])  # a sync call where a loop runs

    _same_as_plain(lambda r: r.engine(), lambda engine: asyncio.run(ask(engine)))


@pytest.mark.parametrize("api", list(ASK))
def test_index_nodes_resolve_inside_the_retrieve_span_as_in_plain(api: str) -> None:
    def build(records: Records) -> RetrieverQueryEngine:
        retriever = recursive_retriever()
        retriever.callback_manager = records.manager
        return RetrieverQueryEngine.from_args(retriever, llm=make_llm(), callback_manager=records.manager)

    tree = _same_as_plain(build, ASK[api]("cats at dusk")).tree()
    method = "retrieve" if api == "query" else "aretrieve"
    nested = [e for e in tree if e[0] == "span" and e[1] == f"VectorIndexRetriever.{method}"]
    assert len(nested) == 2 and nested[1][3] == f"VectorIndexRetriever.{method}"  # the sub-index's, inside


@pytest.mark.parametrize("api", list(ASK))
@pytest.mark.parametrize("failing", ["embedding", "search"])
def test_a_failing_embedding_or_search_drops_the_spans_plain_drops(api: str, failing: str) -> None:
    if failing == "embedding":
        build: Callable[[Records], Any] = lambda r: r.engine()  # noqa: E731
        error = "RuntimeError"
    else:
        build, error = (lambda r: r.engine(store=BoomStore(), embed=HashEmbedding)), "ValueError"
    tree = _same_as_plain(build, ASK[api]("boom?")).tree()
    method = "retrieve" if api == "query" else "aretrieve"
    drops = [(e[1], e[2]) for e in tree if e[0] == "drop"]
    assert drops[-4:] == [
        (f"VectorIndexRetriever._{method}", error),
        (f"VectorIndexRetriever.{method}", error),
        (f"RetrieverQueryEngine._{'query' if api == 'query' else 'aquery'}", error),
        (f"RetrieverQueryEngine.{'query' if api == 'query' else 'aquery'}", error),
    ]


# -- concurrent queries --------------------------------------------------------------------


def _gathered(questions: list[str]) -> Callable[[Any], Any]:
    async def main(engine: Any) -> list[Any]:
        results = await asyncio.gather(*(engine.aquery(q) for q in questions), return_exceptions=True)
        return [summary(r) if isinstance(r, BaseException) else str(r) for r in results]

    return lambda engine: asyncio.run(main(engine))


def _threaded(questions: list[str]) -> Callable[[Any], Any]:
    def one(engine: Any, question: str) -> Any:
        try:
            return str(engine.query(question))
        except Exception as exc:
            return summary(exc)

    def ask(engine: Any) -> list[Any]:
        with concurrent.futures.ThreadPoolExecutor(len(questions)) as pool:
            return list(pool.map(lambda q: one(engine, q), questions))

    return ask


@pytest.mark.parametrize("how", [_gathered, _threaded], ids=["aquery-gathered", "query-threads"])
@pytest.mark.parametrize("with_failure", [False, True], ids=["all-answer", "one-embedding-fails"])
def test_concurrent_queries_record_what_plain_records(how: Callable[..., Any], with_failure: bool) -> None:
    questions = [*QUESTIONS, "boom!"] if with_failure else QUESTIONS
    canonical = _same_as_plain(lambda r: r.engine(), how(questions), concurrent=True).canonical()
    roots = canonical[1]
    assert len(roots) == len(questions)
    dropped = [root for root in roots if root[-2][0] == "drop"]
    assert len(dropped) == (1 if with_failure else 0)


# -- QueryPipeline (llama-index-core 0.12) ---------------------------------------------------


@pytest.mark.parametrize("api", ["run", "arun"])
def test_pipeline_retriever_modules_beside_an_llm_record_what_plain_records(api: str) -> None:
    """Two retrievers and an LLM branch: a sync run's records follow each other as plain's (a
    retrieval holds the caller's thread while open); an async run's wave runs concurrently in
    plain too, so its spans are compared as trees."""
    qp = pytest.importorskip("llama_index.core.query_pipeline")
    from llama_index.core import PromptTemplate

    def build(records: Records) -> Any:
        retriever = records.engine().retriever
        other = retriever._index.as_retriever(similarity_top_k=3)
        other.callback_manager = records.manager
        p = qp.QueryPipeline(callback_manager=records.manager)
        p.add_modules(
            {
                "input": qp.InputComponent(),
                "a": retriever,
                "b": other,
                "prompt": PromptTemplate("Rewrite as a title: {q}"),
                "llm": make_llm(),
            }
        )
        p.add_link("input", "a")
        p.add_link("input", "b")
        p.add_link("input", "prompt", dest_key="q")
        p.add_link("prompt", "llm")
        return p

    def ask(pipeline: Any) -> Any:
        inputs = {"input": {"input": "cats at dusk"}}
        if api == "run":
            return pipeline.run_multi(inputs)
        return asyncio.run(pipeline.arun_multi(inputs))

    # `run_jobs` / `worker` are the executor's (`executor_spans`): Teola has no coroutines to
    # list in their arguments, and `run_jobs` exits with None, not with the modules' outputs.
    _same_as_plain(build, ask, concurrent=api == "arun", loose=("run_jobs",))


def test_a_query_failing_elsewhere_closes_the_open_retrieval_with_its_error() -> None:
    """A parallel branch fails while the retrieval embeds: Teola drops the retrieval's spans
    with that error and ends its callback event and trace (plain's `run_jobs` would leave the
    retrieval running: docs/llamaindex.md, "Decomposed components")."""
    qp = pytest.importorskip("llama_index.core.query_pipeline")
    from llama_index.core import PromptTemplate

    class SlowEmbedding(HashEmbedding):
        async def _aget_query_embedding(self, query: str) -> list[float]:
            await asyncio.sleep(0.2)
            return self._vec(query)

    class BrokenLLM(type(make_llm())):  # type: ignore[misc]
        async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
            raise RuntimeError("the model is down")

    records = Records()
    retriever = records.engine(embed=SlowEmbedding).retriever
    pipeline = qp.QueryPipeline(callback_manager=records.manager)
    pipeline.add_modules(
        {"input": qp.InputComponent(), "r": retriever, "prompt": PromptTemplate("{q}"), "llm": BrokenLLM()}
    )
    pipeline.add_link("input", "r")
    pipeline.add_link("input", "prompt", dest_key="q")
    pipeline.add_link("prompt", "llm")
    fast = teola.optimize(pipeline)
    try:
        outcome, seen, callbacks, _ = records.run(lambda: asyncio.run(fast.arun_multi({"input": {"input": "cats"}})))
    finally:
        fast.close()
    assert outcome == ("error", "RuntimeError", "the model is down")
    tree = seen.tree()
    opened = [e[1] for e in tree if e[0] == "span"]
    assert sorted(opened) == sorted(e[1] for e in tree if e[0] in ("exit", "drop"))  # nothing left open
    assert ("drop", "VectorIndexRetriever._aretrieve", "RuntimeError") in [e[:3] for e in tree]
    assert ("drop", "VectorIndexRetriever.aretrieve", "RuntimeError") in [e[:3] for e in tree]
    assert ("cb-end", "CBEventType.RETRIEVE") in [e[:2] for e in callbacks]
