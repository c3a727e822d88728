"""What tracing tools see is LlamaIndex's own: the same spans, events and callback events with Teola.

A span and event handler on LlamaIndex's root dispatcher (what Phoenix or Langfuse attach)
and a legacy `CallbackManager`, wherever it is set, record a plain run and an optimized
run of the same object; the records must be equal. Sequential runs are compared in order;
async QueryPipeline runs, whose modules of one wave run concurrently in LlamaIndex too,
as span trees.
"""

from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from li_fakes import make_index, make_llm
from li_trace import CallbackRecorder, Recorder
from llama_index.core import PromptTemplate, Settings
from llama_index.core.base.base_selector import BaseSelector
from llama_index.core.callbacks import CallbackManager
from llama_index.core.indices.query.query_transform.base import IdentityQueryTransform
from llama_index.core.postprocessor import SimilarityPostprocessor
from llama_index.core.query_engine import (
    CustomQueryEngine,
    RetrieverQueryEngine,
    RouterQueryEngine,
    TransformQueryEngine,
)
from llama_index.core.response_synthesizers import TreeSummarize, get_response_synthesizer
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.core.selectors import SelectorResult, SingleSelection
from llama_index.core.tools import QueryEngineTool

import teola
from teola_llamaindex import OpaqueModuleWarning

INDEX = make_index()
QUESTION = "what do cats do at dusk?"


def _optimize(obj: Any, **options: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OpaqueModuleWarning)
        return teola.optimize(obj, **options)


def _record(call: Callable[[], Any]) -> tuple[str, Recorder]:
    with Recorder() as seen:
        result = call()
    return str(result), seen


def _same_sequential(plain: Callable[[], Any], fast: Callable[[], Any]) -> None:
    want, theirs = _record(plain)
    got, ours = _record(fast)
    assert got == want
    assert ours.tree() == theirs.tree()


def _engine(callback_manager: CallbackManager | None = None, **synth: Any) -> RetrieverQueryEngine:
    return RetrieverQueryEngine.from_args(
        INDEX.as_retriever(similarity_top_k=2), llm=make_llm(), callback_manager=callback_manager, **synth
    )


# -- query engines -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["compact", "refine", "tree_summarize"])
def test_retriever_query_engine_spans_and_events_are_llamaindex_own(mode: str) -> None:
    engine = _engine(response_mode=mode)
    fast = _optimize(engine)
    _same_sequential(lambda: engine.query(QUESTION), lambda: fast.query(QUESTION))
    _same_sequential(lambda: asyncio.run(engine.aquery(QUESTION)), lambda: asyncio.run(fast.aquery(QUESTION)))
    assert fast.calls_on_graph == 2
    names = {entry[1] for entry in _record(lambda: fast.query(QUESTION))[1].tree()}
    assert {"RetrieverQueryEngine.query", "QueryStartEvent", "QueryEndEvent", "RetrieverQueryEngine._query"} <= names


def _callbacks(where: str) -> tuple[Callable[[], Any], CallbackRecorder]:
    """A query engine whose callback manager is set `where`; the recorder it reports to."""
    recorder = CallbackRecorder()
    manager = CallbackManager([recorder])
    if where == "engine":
        return lambda: _engine(callback_manager=manager), recorder
    if where == "retriever":

        def build() -> RetrieverQueryEngine:
            engine = _engine()
            engine.retriever.callback_manager = manager
            return engine

        return build, recorder

    def in_settings() -> RetrieverQueryEngine:
        Settings.callback_manager = manager
        try:
            return _engine()
        finally:
            Settings.callback_manager = CallbackManager([])

    return in_settings, recorder


@pytest.mark.parametrize("where", ["engine", "retriever", "settings"])
@pytest.mark.parametrize("sync", [True, False], ids=["query", "aquery"])
def test_callback_events_match_wherever_the_manager_is_set(where: str, sync: bool) -> None:
    build, recorder = _callbacks(where)
    engine, fast = build(), _optimize(build())

    def ask(obj: Any) -> Any:
        return obj.query(QUESTION) if sync else asyncio.run(obj.aquery(QUESTION))

    answer = str(ask(engine))
    plain_events, recorder.log = recorder.log, []
    assert str(ask(fast)) == answer
    assert recorder.log == plain_events and plain_events


def test_a_failing_step_drops_the_same_spans() -> None:
    class Boom(SimilarityPostprocessor):
        def _postprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None) -> Any:
            raise RuntimeError("boom")

    engine = RetrieverQueryEngine.from_args(INDEX.as_retriever(), llm=make_llm(), node_postprocessors=[Boom()])
    fast = _optimize(engine)
    logs = []
    for obj in (engine, fast):
        with Recorder() as seen, pytest.raises(RuntimeError, match="boom"):
            obj.query(QUESTION)
        logs.append(seen.tree())
    assert logs[0] == logs[1]
    assert ("drop", "RetrieverQueryEngine.query", "RuntimeError") in logs[1]


class Echo(CustomQueryEngine):
    """A user's own query engine: Teola cannot see into it, so it runs as itself, as one step."""

    def custom_query(self, query_str: str) -> str:
        return f"echo: {query_str}"


class MyEngine(RetrieverQueryEngine):
    """A subclass may override `_query`: it runs as itself too."""


def test_an_engine_teola_does_not_trace_runs_as_itself_with_its_own_spans() -> None:
    synthesizer = get_response_synthesizer(llm=make_llm())
    for engine in (Echo(), MyEngine(retriever=INDEX.as_retriever(), response_synthesizer=synthesizer)):
        with pytest.warns(OpaqueModuleWarning, match="runs as itself"):
            fast = teola.optimize(engine)
        _same_sequential(lambda e=engine: e.query(QUESTION), lambda f=fast: f.query(QUESTION))
        _same_sequential(
            lambda e=engine: asyncio.run(e.aquery(QUESTION)), lambda f=fast: asyncio.run(f.aquery(QUESTION))
        )
        assert fast.calls_on_graph == 2


def test_sync_calls_run_the_users_components_on_the_calling_thread() -> None:
    """As LlamaIndex's sync path does: thread-bound resources (SQLite, thread locals) behave the same."""
    threads: list[int] = []

    class Where(SimilarityPostprocessor):
        def _postprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None) -> Any:
            threads.append(threading.get_ident())
            return nodes

    fast = _optimize(
        RetrieverQueryEngine.from_args(INDEX.as_retriever(), llm=make_llm(), node_postprocessors=[Where()])
    )
    fast.query(QUESTION)
    assert threads == [threading.get_ident()]


# -- QueryPipeline (llama-index-core 0.12) ------------------------------------------------


def _pipeline() -> Any:
    qp = pytest.importorskip("llama_index.core.query_pipeline")
    llm = make_llm()
    p = qp.QueryPipeline()
    p.add_modules(
        {
            "input": qp.InputComponent(),
            "retriever": INDEX.as_retriever(similarity_top_k=2),
            "prompt": PromptTemplate("Rewrite as a title: {q}"),
            "llm": llm,
            "summarize": TreeSummarize(llm=llm),
        }
    )
    p.add_link("input", "retriever")
    p.add_link("input", "prompt", dest_key="q")
    p.add_link("prompt", "llm")
    p.add_link("retriever", "summarize", dest_key="nodes")
    p.add_link("llm", "summarize", dest_key="query_str")
    return p


def test_pipeline_run_spans_events_and_the_run_callback_manager_are_llamaindex_own() -> None:
    pipeline = _pipeline()
    fast = _optimize(_pipeline())
    records = []
    for obj in (pipeline, fast):
        recorder = CallbackRecorder()
        answer, seen = _record(lambda o=obj, r=recorder: o.run(input="cats", callback_manager=CallbackManager([r])))
        records.append((answer, seen.tree(), recorder.log))
    assert records[1] == records[0]
    assert ("cb-start", "CBEventType.LLM", "under", "CBEventType.QUERY") in records[1][2]  # plain: query and llm


def test_pipeline_arun_span_tree_is_llamaindex_own_executor_spans_included() -> None:
    """`run_jobs` per wave and a `worker` per module, as QueryPipeline's async executor makes them."""
    pipeline, fast = _pipeline(), _optimize(_pipeline())
    want, theirs = _record(lambda: asyncio.run(pipeline.arun(input="cats")))
    got, ours = _record(lambda: asyncio.run(fast.arun(input="cats")))
    assert got == want and ours.canonical() == theirs.canonical()
    assert sum(entry[1] == "run_jobs" for entry in ours.tree() if entry[0] == "span") == 4  # four waves


@pytest.mark.parametrize("method", ["run_with_intermediates", "batch"])
def test_pipeline_other_entry_points_keep_their_spans(method: str) -> None:
    pipeline, fast = _pipeline(), _optimize(_pipeline())

    def call(obj: Any) -> Any:
        if method == "batch":
            return obj.run(input=["cats", "dogs"], batch=True)
        return obj.run_with_intermediates(input="cats")[0]

    want, theirs = _record(lambda: call(pipeline))
    got, ours = _record(lambda: call(fast))
    assert got == want and ours.canonical() == theirs.canonical()


def test_pipeline_callback_manager_set_by_run_stays_set_as_in_llamaindex() -> None:
    """`run(callback_manager=m)` sets `m` on the pipeline and its modules; it stays for later runs."""
    pipeline = _pipeline()
    fast = _optimize(pipeline)
    recorder = CallbackRecorder()
    manager = CallbackManager([recorder])
    fast.run(input="cats", callback_manager=manager)
    assert pipeline.callback_manager is manager and fast.callback_manager is manager
    assert all(getattr(m, "callback_manager", manager) is manager for m in pipeline.module_dict.values())
    before = len(recorder.log)
    fast.run(input="dogs")
    assert len(recorder.log) == 2 * before


class SecondEngine(BaseSelector):
    """Always picks the second choice (a router's LLM selector, without the LLM)."""

    def _get_prompts(self) -> dict[str, Any]:
        return {}

    def _update_prompts(self, prompts: Any) -> None:
        pass

    def _select(self, choices: Any, query: QueryBundle) -> SelectorResult:
        return SelectorResult(selections=[SingleSelection(index=1, reason="fixed")])

    async def _aselect(self, choices: Any, query: QueryBundle) -> SelectorResult:
        return self._select(choices, query)


def _router() -> RouterQueryEngine:
    tools = [
        QueryEngineTool.from_defaults(_engine(response_mode=mode), description=f"{mode} answers")
        for mode in ("compact", "tree_summarize")
    ]
    return RouterQueryEngine(selector=SecondEngine(), query_engine_tools=tools, llm=make_llm())


@pytest.mark.parametrize(
    "build",
    [lambda: TransformQueryEngine(_engine(), query_transform=IdentityQueryTransform()), _router],
    ids=["transform", "router"],
)
def test_retriever_query_engines_inside_an_opaque_engine_are_traced(build: Callable[[], Any]) -> None:
    engine, user_object = build(), build()

    def state() -> dict[str, Any]:
        return {k: tuple(v) if isinstance(v, list) else v for k, v in vars(user_object).items()}

    before = state()
    with pytest.warns(OpaqueModuleWarning, match="RetrieverQueryEngine\\(s\\) inside it are traced"):
        fast = teola.optimize(user_object)
    assert state() == before  # the parts are swapped on a copy
    _same_sequential(lambda: engine.query(QUESTION), lambda: fast.query(QUESTION))
    _same_sequential(lambda: asyncio.run(engine.aquery(QUESTION)), lambda: asyncio.run(fast.aquery(QUESTION)))
    assert fast.parts and sum(part.calls_on_graph for part in fast.parts) == 2
