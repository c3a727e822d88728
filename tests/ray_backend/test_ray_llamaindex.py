"""LlamaIndex drop-ins on `backend="ray"` (query engines and QueryPipelines on 0.12, query
engines, workflows and agents on 0.14): the same answers as plain.

The engines over the app's own LlamaIndex objects stay in the driver (`driver_only`: they
call them in each query's context); a Teola engine given with `engines=` runs in a Ray
actor on the node its resources name. Before this, a drop-in placed its engines before it
had traced any (every query failed: "no engine named 'retriever:...'").
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("llama_index.core", reason="the LlamaIndex drop-ins on Ray need llama-index-core")
ray = pytest.importorskip("ray")

from llama_index.core import __version__ as llama_index_version  # noqa: E402
from llamaindex_adapter.li_fakes import make_index, make_llm  # noqa: E402
from ray_li_engines import IndexSearch  # noqa: E402

import teola  # noqa: E402

QUESTIONS = [f"{topic} {i}" for i, topic in enumerate(["cats at dusk", "wolves", "vector stores", "refine"] * 5)]
RETRIEVER = "retriever:VectorIndexRetriever"  # a whole retrieval's engine (given with engines=, or decompose=False)
SEARCH = "vectordb:VectorIndexRetriever"  # its search half's (by default: decomposed into EMBED + SEARCH)


@pytest.fixture
def by_value(ray_cluster: Any) -> None:
    """The test engine and the fakes it carries ship to the workers by value."""
    import ray_li_engines
    from llamaindex_adapter import li_fakes

    for module in (ray_li_engines, li_fakes):
        ray.cloudpickle.register_pickle_by_value(module)


INDEX = make_index()
LI_VERSION = tuple(int(p) for p in llama_index_version.split(".")[:2])


def query_engine() -> Any:
    return INDEX.as_query_engine(llm=make_llm(max_tokens=None), similarity_top_k=2)


def answer(response: Any) -> tuple[str, list[tuple[str, float | None]]]:
    """A response's text and its sources (node id, score)."""
    return str(response), [(n.node.node_id, n.score) for n in response.source_nodes]


def test_a_query_engine_on_its_own_components_answers_on_ray_as_plain(ray_cluster: Any) -> None:
    """Every framework engine stays in the driver: nothing of the app's objects is copied to an actor."""
    engine = query_engine()
    for options in ({}, {"decompose": False}, {"decompose": True}):
        fast = teola.optimize(engine, backend="ray", **options)
        try:
            assert set(fast.where().values()) == {"driver"}
            expected = [answer(engine.query(q)) for q in QUESTIONS]
            assert [answer(fast.query(q)) for q in QUESTIONS] == expected
        finally:
            fast.close()


@pytest.mark.usefixtures("by_value")
def test_a_teola_engine_of_a_query_engine_runs_where_its_resources_say(resource_nodes: dict[str, str]) -> None:
    engine = query_engine()
    fast = teola.optimize(
        engine,
        backend="ray",
        engines=[(engine.retriever, IndexSearch(INDEX, top_k=2))],
        ray={"engines": {IndexSearch: {"resources": {"nodeB": 1}}}},
    )
    try:
        expected = [answer(engine.query(q)) for q in QUESTIONS]

        async def concurrently() -> list[Any]:
            return [answer(r) for r in await asyncio.gather(*(fast.aquery(q) for q in QUESTIONS))]

        assert asyncio.run(concurrently()) == expected  # async: the caller's loop
        assert [answer(fast.query(q)) for q in QUESTIONS] == expected  # sync: the caller's thread
        assert fast.where() == {RETRIEVER: "1 Ray actor(s), each CPU=1, nodeB=1"}
        pool = fast.runtimes.placed.pools[RETRIEVER]
        assert [i.node_id for i in pool.infos if i] == [resource_nodes["nodeB"]]
        assert sum(pool.served) == 2 * len(QUESTIONS)  # every retrieval ran in that actor
        assert f"{RETRIEVER} (1 Ray actor(s), each CPU=1, nodeB=1)" in fast.explain()
    finally:
        fast.close()


def test_options_are_checked_against_what_was_traced() -> None:
    engine = query_engine()
    with pytest.raises(ValueError, match=rf"engine '{SEARCH}' \(LlamaIndexRetrieverEngine\) cannot run in a Ray"):
        teola.optimize(engine, backend="ray", ray={"engines": {SEARCH: {"resources": {"nodeA": 1}}}})
    with pytest.raises(ValueError, match=rf"engine '{RETRIEVER}' \(LlamaIndexRetrieverEngine\) cannot run in a Ray"):
        options = {"engines": {RETRIEVER: {"resources": {"nodeA": 1}}}}
        teola.optimize(engine, backend="ray", decompose=False, ray=options)
    with pytest.raises(ValueError, match=r"names 'retriever', which this app does not use \(its engines: embed:"):
        teola.optimize(engine, backend="ray", ray={"engines": {"retriever": {}}})
    with pytest.raises(ValueError, match="engines= names components that no traced step runs on an engine"):
        teola.optimize(engine, engines=[(make_llm(), IndexSearch(INDEX, top_k=2))])
    with pytest.raises(ValueError, match="ray= options need backend='ray'"):
        teola.optimize(engine, ray={})
    with pytest.raises(TypeError, match="unexpected keyword argument 'rays'"):
        teola.optimize(engine, backend="ray", rays={})


@pytest.mark.skipif(LI_VERSION < (0, 13), reason="Workflows are tested on the 0.14 line")
def test_a_workflow_and_an_agent_answer_on_ray_as_plain(ray_cluster: Any) -> None:
    """`backend="ray"` on the workflow and agent drop-ins (the drop-in kit's one runtime
    factory): their graphs run on a Ray runtime, the app's models stay in the driver."""
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.llms.mock import MockFunctionCallingLLM
    from llama_index.core.workflow import StartEvent, StopEvent, Workflow, step

    from teola_core.runtime.ray import RayRuntime

    class Draft(Workflow):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.llm = make_llm(max_tokens=8)

        @step
        async def draft(self, ev: StartEvent) -> StopEvent:
            return StopEvent(result=str(await self.llm.acomplete(f"Draft: {ev.topic}")))

    async def runs(app: Any) -> list[str]:
        return [await app.run(topic=q) for q in QUESTIONS[:4]]

    async def agent_runs(app: Any) -> list[str]:
        return [str((await app.run(user_msg=q)).response.content) for q in QUESTIONS[:4]]

    for plain, run in ((Draft(), runs), (FunctionAgent(tools=[], llm=MockFunctionCallingLLM()), agent_runs)):
        expected = asyncio.run(run(plain))
        fast = teola.optimize(plain, backend="ray")

        async def on_ray(fast: Any = fast, run: Any = run) -> tuple[list[str], Any]:
            return await run(fast), fast.runtime()

        try:
            got, runtime = asyncio.run(on_ray())
            assert got == expected
            assert isinstance(getattr(runtime, "runtime", runtime), RayRuntime)  # an agent runtime wraps it
            assert set(fast.where().values()) == {"driver"}
        finally:
            fast.close()


def test_a_query_pipeline_answers_on_ray_as_plain(ray_cluster: Any) -> None:
    """The QueryPipeline row of the drop-in family on `backend="ray"` (llama-index-core 0.12)."""
    pipelines = pytest.importorskip("llama_index.core.query_pipeline", reason="QueryPipeline exists up to 0.12")
    from llama_index.core import PromptTemplate

    pipeline = pipelines.QueryPipeline()
    pipeline.add_modules(
        {
            "input": pipelines.InputComponent(),
            "retriever": INDEX.as_retriever(similarity_top_k=2),
            "join": pipelines.FnComponent(fn=lambda nodes: "\n".join(n.get_content() for n in nodes)),
            "prompt": PromptTemplate("Context:\n{context}\nQuestion: {q}\nAnswer:"),
            "llm": make_llm(max_tokens=None),
        }
    )
    pipeline.add_link("input", "retriever")
    pipeline.add_link("retriever", "join")
    pipeline.add_link("join", "prompt", dest_key="context")
    pipeline.add_link("input", "prompt", dest_key="q")
    pipeline.add_link("prompt", "llm")
    fast = teola.optimize(pipeline, backend="ray", warn=False)
    try:
        expected = [str(pipeline.run(input=q)) for q in QUESTIONS[:4]]
        assert [str(fast.run(input=q)) for q in QUESTIONS[:4]] == expected
        assert set(fast.where().values()) == {"driver"}  # the app's own components stay there
    finally:
        fast.close()
