"""QueryPipeline executor swap: the optimized pipeline returns what the original returns.

Each shape builds a pipeline and a call; the original executor and Teola's (sync and
async) must give equal results (MockLLM echoes its prompt, so equal answers mean equal
prompts, and retrieval results depend on the query through HashEmbedding).
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from drop_in_family import check_drop_in
from li_fakes import make_index, make_llm
from llama_index.core import PromptTemplate
from llama_index.core.postprocessor import SimilarityPostprocessor
from llama_index.core.prompts.base import PromptComponent
from llama_index.core.query_pipeline import (
    ArgPackComponent,
    FnComponent,
    InputComponent,
    QueryPipeline,
)
from llama_index.core.response_synthesizers import get_response_synthesizer

import teola
from teola_core.ir.kinds import PrimitiveKind
from teola_core.profiles.profile import Curve, LatencyProfile
from teola_llamaindex import OpaqueModuleWarning, TeolaQueryPipelineExecutor

INDEX = make_index()


def _llm() -> Any:
    return make_llm(max_tokens=None)


def _join(nodes: list[Any]) -> str:
    return "\n".join(n.get_content() for n in nodes)


def chain_prompt_llm() -> QueryPipeline:
    return QueryPipeline(chain=[PromptTemplate("Tell me about {topic}."), _llm()])


def chain_prompt_llm_fn() -> QueryPipeline:
    return QueryPipeline(chain=[PromptTemplate("Say {x}"), _llm(), FnComponent(fn=lambda r: str(r).upper())])


def chain_retriever_fn() -> QueryPipeline:
    return QueryPipeline(chain=[INDEX.as_retriever(similarity_top_k=2), FnComponent(fn=_join)])


def rag() -> QueryPipeline:
    p = QueryPipeline()
    p.add_modules(
        {
            "input": InputComponent(),
            "retriever": INDEX.as_retriever(similarity_top_k=2),
            "join": FnComponent(fn=_join),
            "prompt": PromptTemplate("Context:\n{context}\nQuestion: {q}\nAnswer:"),
            "llm": _llm(),
        }
    )
    p.add_link("input", "retriever")
    p.add_link("retriever", "join")
    p.add_link("join", "prompt", dest_key="context")
    p.add_link("input", "prompt", dest_key="q")
    p.add_link("prompt", "llm")
    return p


def rag_synth(mode: str = "compact") -> Callable[[], QueryPipeline]:
    def build() -> QueryPipeline:
        p = QueryPipeline()
        p.add_modules(
            {
                "input": InputComponent(),
                "retriever": INDEX.as_retriever(similarity_top_k=3),
                "synth": get_response_synthesizer(llm=_llm(), response_mode=mode),
            }
        )
        p.add_link("input", "retriever")
        p.add_link("input", "synth", dest_key="query_str")
        p.add_link("retriever", "synth", dest_key="nodes")
        return p

    return build


def rag_postprocess() -> QueryPipeline:
    p = QueryPipeline()
    p.add_modules(
        {
            "input": InputComponent(),
            "retriever": INDEX.as_retriever(similarity_top_k=4),
            "post": SimilarityPostprocessor(similarity_cutoff=0.0),
            "synth": get_response_synthesizer(llm=_llm()),
        }
    )
    p.add_link("input", "retriever")
    p.add_link("retriever", "post", dest_key="nodes")
    p.add_link("input", "post", dest_key="query_str")
    p.add_link("input", "synth", dest_key="query_str")
    p.add_link("post", "synth", dest_key="nodes")
    return p


def two_llms_combined() -> QueryPipeline:
    p = QueryPipeline()
    p.add_modules(
        {
            "input": InputComponent(),
            "p1": PromptTemplate("Pros of {x}"),
            "p2": PromptTemplate("Cons of {x}"),
            "l1": _llm(),
            "l2": _llm(),
            "combine": FnComponent(fn=lambda a, b: f"{a} | {b}"),
        }
    )
    p.add_link("input", "p1")
    p.add_link("input", "p2")
    p.add_link("p1", "l1")
    p.add_link("p2", "l2")
    p.add_link("l1", "combine", dest_key="a")
    p.add_link("l2", "combine", dest_key="b")
    return p


def multi_query_argpack() -> QueryPipeline:
    """Two retrievals joined by an ArgPack (which QueryPipeline runs in wave 0)."""
    p = QueryPipeline()
    p.add_modules(
        {
            "input": InputComponent(),
            "r1": INDEX.as_retriever(similarity_top_k=1),
            "r2": INDEX.as_retriever(similarity_top_k=2),
            "join": ArgPackComponent(),
            "fmt": FnComponent(fn=lambda nodes, q: f"{q}: {len(nodes)}"),
        }
    )
    p.add_link("input", "r1")
    p.add_link("input", "r2")
    p.add_link("r1", "join", dest_key="a")
    p.add_link("r2", "join", dest_key="b")
    p.add_link("join", "fmt", dest_key="nodes")
    p.add_link("input", "fmt", dest_key="q")
    return p


def conditional() -> QueryPipeline:
    p = QueryPipeline()
    p.add_modules(
        {
            "input": InputComponent(),
            "classify": FnComponent(fn=lambda q: {"q": q, "long": len(q) > 10}),
            "short": PromptTemplate("Short: {q}"),
            "long": PromptTemplate("Long: {q}"),
            "llm_s": _llm(),
            "llm_l": _llm(),
        }
    )
    p.add_link("input", "classify")
    p.add_link("classify", "short", input_fn=lambda d: d["q"], condition_fn=lambda d: not d["long"])
    p.add_link("classify", "long", input_fn=lambda d: d["q"], condition_fn=lambda d: d["long"])
    p.add_link("short", "llm_s")
    p.add_link("long", "llm_l")
    return p


def src_key_link() -> QueryPipeline:
    p = QueryPipeline()
    p.add_modules({"input": InputComponent(), "pick": FnComponent(fn=lambda d: sorted(d))})
    p.add_link("input", "pick", src_key="input")
    return p


def input_fn_link() -> QueryPipeline:
    p = QueryPipeline()
    p.add_modules({"input": InputComponent(), "prompt": PromptTemplate("Q: {q}"), "llm": _llm()})
    p.add_link("input", "prompt", dest_key="q", input_fn=lambda s: s.strip().title())
    p.add_link("prompt", "llm")
    return p


def partials() -> QueryPipeline:
    fn = FnComponent(fn=lambda text, suffix: f"{text}{suffix}")
    fn.partial(suffix="!!")
    return QueryPipeline(chain=[PromptTemplate("About {t}"), _llm(), fn])


def partial_prompt() -> QueryPipeline:
    return QueryPipeline(chain=[PromptTemplate("{greeting}, tell me about {t}").partial_format(greeting="Hi"), _llm()])


def prompt_component_partial() -> QueryPipeline:
    prompt = PromptComponent(prompt=PromptTemplate("{a} and {b}, not {c}"))
    prompt.partial(b="B", c="C")
    p = QueryPipeline()
    p.add_modules({"input": InputComponent(), "prompt": prompt, "llm": _llm()})
    p.add_link("input", "prompt", dest_key="a")
    p.add_link("prompt", "llm")
    return p


def literal_braces() -> QueryPipeline:
    return QueryPipeline(chain=[PromptTemplate('Return JSON like {{"a": 1}} for {topic} {not a var}'), _llm()])


def optional_key() -> QueryPipeline:
    p = QueryPipeline()
    p.add_modules(
        {
            "input": InputComponent(),
            "first": FnComponent(fn=lambda x: x * 2),
            "second": FnComponent(fn=lambda x: x + 1),
            "end": FnComponent(fn=lambda a, b="default": f"{a}/{b}"),
        }
    )
    p.add_link("input", "first")
    p.add_link("first", "second")
    p.add_link("second", "end", dest_key="a")
    p.add_link("input", "end", dest_key="b")
    return p


def nested() -> QueryPipeline:
    inner = QueryPipeline(chain=[PromptTemplate("Inner {x}"), _llm()])
    return QueryPipeline(chain=[PromptTemplate("Outer {y}"), _llm(), FnComponent(fn=lambda r: str(r)), inner])


SHAPES: dict[str, tuple[Callable[[], QueryPipeline], dict[str, Any]]] = {
    "prompt-llm": (chain_prompt_llm, {"topic": "cats"}),
    "prompt-llm-fn": (chain_prompt_llm_fn, {"x": "hello"}),
    "retriever-fn": (chain_retriever_fn, {"input": "dogs and wolves"}),
    "rag": (rag, {"input": "what do cats do?"}),
    "rag-synth-compact": (rag_synth("compact"), {"input": "vector stores"}),
    "rag-synth-refine": (rag_synth("refine"), {"input": "refine mode"}),
    "rag-synth-tree": (rag_synth("tree_summarize"), {"input": "pipelines"}),
    "rag-postprocess": (rag_postprocess, {"input": "teola"}),
    "two-llms": (two_llms_combined, {"input": "tea"}),
    "argpack": (multi_query_argpack, {"input": "cats"}),
    "conditional-short": (conditional, {"input": "hi"}),
    "conditional-long": (conditional, {"input": "a much longer question"}),
    "src-key": (src_key_link, {"input": {"b": 1, "a": 2}}),
    "input-fn": (input_fn_link, {"input": "  hello world "}),
    "partials": (partials, {"t": "owls"}),
    "partial-prompt": (partial_prompt, {"t": "owls"}),
    "literal-braces": (literal_braces, {"topic": "birds"}),
    "prompt-component-partial": (prompt_component_partial, {"input": "A"}),
    "optional-key": (optional_key, {"input": 3}),
    "nested": (nested, {"y": "nest"}),
}


def _plain(result: tuple[Any, dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
    """`ComponentIntermediates` compares by identity: compare its inputs and outputs."""
    output, intermediates = result
    return output, {k: (v.inputs, v.outputs) for k, v in intermediates.items()}


def _quiet(pipeline: QueryPipeline) -> TeolaQueryPipelineExecutor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OpaqueModuleWarning)
        return teola.optimize(pipeline)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_run_sync_and_async_equal_original(shape: str) -> None:
    build, kwargs = SHAPES[shape]
    pipeline = build()
    expected = pipeline.run(**kwargs)
    fast = _quiet(pipeline)
    assert fast.plan is not None, fast.fallback
    assert fast.run(**kwargs) == expected
    assert asyncio.run(fast.arun(**kwargs)) == expected
    assert asyncio.run(pipeline.arun(**kwargs)) == expected
    fast.close()


@pytest.mark.parametrize("shape", ["rag", "two-llms", "conditional-long", "optional-key", "argpack"])
def test_run_with_intermediates_equal(shape: str) -> None:
    build, kwargs = SHAPES[shape]
    pipeline = build()
    fast = _quiet(pipeline)
    assert _plain(fast.run_with_intermediates(**kwargs)) == _plain(pipeline.run_with_intermediates(**kwargs))
    got = _plain(asyncio.run(fast.arun_with_intermediates(**kwargs)))
    assert got == _plain(asyncio.run(pipeline.arun_with_intermediates(**kwargs)))


@pytest.mark.parametrize("shape", ["rag", "rag-synth-compact", "two-llms", "conditional-short"])
def test_batch_equal(shape: str) -> None:
    build, kwargs = SHAPES[shape]
    (key,) = kwargs
    batch = {key: [kwargs[key], "another question here", "q"]}
    pipeline = build()
    fast = _quiet(pipeline)
    expected = pipeline.run(batch=True, **batch)
    assert fast.run(batch=True, **batch) == expected
    assert asyncio.run(fast.arun(batch=True, **batch)) == expected


def _two_roots() -> QueryPipeline:
    p = QueryPipeline()
    p.add_modules(
        {
            "a": PromptTemplate("A {x}"),
            "b": PromptTemplate("B {y}"),
            "join": FnComponent(fn=lambda left, right: left + right),
            "llm": _llm(),
        }
    )
    p.add_link("a", "join", dest_key="left")
    p.add_link("b", "join", dest_key="right")
    p.add_link("join", "llm")
    return p


def test_run_multi_equal() -> None:
    pipeline = _two_roots()
    fast = _quiet(pipeline)
    inputs = {"a": {"x": "1"}, "b": {"y": "2"}}
    expected = pipeline.run_multi(inputs)
    assert fast.run_multi(inputs) == expected
    assert asyncio.run(fast.arun_multi(inputs)) == expected
    got = _plain(fast.run_multi_with_intermediates(inputs))
    assert got == _plain(pipeline.run_multi_with_intermediates(inputs))
    assert asyncio.run(fast.arun_multi_with_intermediates(inputs)) == expected
    batch = {"a": {"x": ["1", "3"]}, "b": {"y": ["2", "4"]}}
    assert fast.run_multi(batch, batch=True) == pipeline.run_multi(batch, batch=True)
    assert asyncio.run(fast.arun_multi(batch, batch=True)) == pipeline.run_multi(batch, batch=True)


def test_rag_traces_into_primitives() -> None:
    fast = _quiet(rag())
    assert fast.plan is not None
    kinds = {n.kind for n in fast.plan.pgraph.nodes.values()}
    assert {PrimitiveKind.EMBED, PrimitiveKind.SEARCH, PrimitiveKind.FORMAT, PrimitiveKind.PREFILL} <= kinds
    assert PrimitiveKind.DECODE in kinds
    assert fast.plan.opaque == ["join (FnComponent)"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OpaqueModuleWarning)
        whole = TeolaQueryPipelineExecutor(rag(), decompose=False)
    assert whole.plan is not None
    kinds = {n.kind for n in whole.plan.pgraph.nodes.values()}
    assert PrimitiveKind.EMBED not in kinds and PrimitiveKind.SEARCH in kinds  # the retriever's own `retrieve`


def test_fn_component_warns_once_naming_module() -> None:
    with pytest.warns(OpaqueModuleWarning, match="'join' \\(FnComponent\\)"):
        TeolaQueryPipelineExecutor(rag())


def test_unsupported_shape_falls_back_with_warning() -> None:
    p = QueryPipeline()
    p.add_modules({"a": InputComponent(), "b": InputComponent(), "f": FnComponent(fn=lambda x: x)})
    p.add_link("a", "f", dest_key="x")
    p.add_link("b", "f", dest_key="x")
    with pytest.warns(OpaqueModuleWarning, match="runs as itself"):
        fast = TeolaQueryPipelineExecutor(p)
    assert fast.plan is None and "explain" not in fast.explain()
    inputs = {"a": {"input": 1}, "b": {"input": 2}}
    assert fast.run_multi(inputs) == p.run_multi(inputs)


def _failing() -> QueryPipeline:
    def boom(x: str) -> str:
        raise KeyError(f"no {x}")

    return QueryPipeline(chain=[PromptTemplate("Q {x}"), _llm(), FnComponent(fn=boom)])


def test_error_is_the_users_exception_naming_the_module() -> None:
    pipeline = _failing()
    module = list(pipeline.module_dict)[2]
    fast = _quiet(pipeline)
    with pytest.raises(KeyError) as sync_info:
        fast.run(x="y")
    assert any(module in note for note in sync_info.value.__notes__)
    with pytest.raises(KeyError) as async_info:
        asyncio.run(fast.arun(x="y"))
    assert any(module in note for note in async_info.value.__notes__)


def test_validation_error_matches_original() -> None:
    pipeline = chain_prompt_llm()
    fast = _quiet(pipeline)
    with pytest.raises(ValueError) as original:
        pipeline.run(topic="a", extra="b")
    with pytest.raises(ValueError) as ours:
        fast.run(topic="a", extra="b")
    assert str(ours.value) == str(original.value)


def test_concurrent_runs_embed_each_query_alone() -> None:
    """Concurrent arun calls share the embed engine; each query's embedding is its own call.

    A LlamaIndex embed model has no joint query-embedding call, so a batch of several
    queries' calls would only make each wait for the slowest (see `engines`).
    """
    pipeline = rag()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OpaqueModuleWarning)
        fast = TeolaQueryPipelineExecutor(pipeline, decompose=True)
    sizes: list[int] = []

    class Hook:
        def on_span(self, span: Any) -> None:
            if span.node.kind == PrimitiveKind.EMBED:
                sizes.append(span.batch_size)

    async def main() -> list[Any]:
        fast.runtime().add_hook(Hook())
        return await asyncio.gather(*(fast.arun(input=f"question {i}") for i in range(6)))

    results = asyncio.run(main())
    assert results == [pipeline.run(input=f"question {i}") for i in range(6)]
    assert sizes == [1] * 6


def test_prefill_split_prefills_the_ready_question_and_keeps_the_answer() -> None:
    """With profiles, the question's prefix is prefilled while retrieval runs; same answers."""
    p = rag()
    p.module_dict["prompt"] = PromptComponent(prompt=PromptTemplate("Question: {q}\nContext:\n{context}\nAnswer:"))
    slow = Curve(((1, 0.05),))
    profiles = {
        "llm:MockLLM": LatencyProfile("llm:MockLLM", {"prefill": Curve(((1, 0.01),)), "decode": Curve(((1, 0.01),))}),
        "embed:HashEmbedding": LatencyProfile("embed:HashEmbedding", {"embed": slow}),
        "vectordb:VectorIndexRetriever": LatencyProfile("vectordb:VectorIndexRetriever", {"search": slow}),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OpaqueModuleWarning)
        fast = TeolaQueryPipelineExecutor(p, profiles=profiles)
    assert fast.plan is not None
    kinds = {n.kind for n in fast.plan.graph.nodes.values()}
    assert PrimitiveKind.PARTIAL_PREFILL in kinds, fast.explain()
    assert fast.run(input="cats?") == p.run(input="cats?")
    assert asyncio.run(fast.arun(input="cats?")) == p.run(input="cats?")


def test_one_llm_feeding_another_is_traced_and_equal() -> None:
    """A completion fed to a second LLM (LlamaIndex turns it into its text): no IR type refuses it."""
    pipeline = QueryPipeline(chain=[PromptTemplate("Q: {x}"), _llm(), make_llm(max_tokens=4)])
    fast = _quiet(pipeline)
    assert fast.plan is not None
    assert [n.kind for n in fast.plan.graph.nodes.values() if n.engine].count(PrimitiveKind.DECODE) == 2
    assert str(fast.run(x="a")) == str(pipeline.run(x="a"))
    assert str(asyncio.run(fast.arun(x="a"))) == str(pipeline.run(x="a"))


def test_a_query_pipeline_is_on_the_drop_in_kit() -> None:
    """The QueryPipeline row of the drop-in family (`tests/drop_in_family.py`)."""
    pipeline = rag()
    fast = _quiet(pipeline)
    asyncio.run(check_drop_in(pipeline, fast, lambda app: _arun(app, "what do cats eat?")))


async def _arun(app: Any, q: str) -> str:
    return str(await app.arun(input=q))
