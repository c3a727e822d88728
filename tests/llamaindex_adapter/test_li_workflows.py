"""Workflows (llama-index-core 0.14): `optimize(workflow).run(...)` equals `workflow.run(...)`.

Each shape runs the plain workflow and the optimized one on the same inputs; the
optimized one must give the same result while its model calls go through Teola's
engine schedulers (checked through a runtime hook).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from llama_index.core import __version__ as li_version
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.llms import LLM, ChatMessage, CompletionResponse, MockLLM

from teola_core.ir.kinds import PrimitiveKind
from teola_core.runtime.base import PrimitiveSpan

pytestmark = pytest.mark.skipif(
    tuple(int(p) for p in li_version.split(".")[:2]) < (0, 13), reason="Workflows are tested on the 0.14 line"
)

if tuple(int(p) for p in li_version.split(".")[:2]) >= (0, 13):
    from engine_watch import hold_batches
    from li_fakes import TEXTS, HashEmbedding, make_index, recursive_retriever
    from llama_index.core.workflow import Context, Event, StartEvent, StopEvent, Workflow, step

    import teola
    from teola_llamaindex.workflows import TeolaWorkflow, step_depths

    class Drafted(Event):
        draft: str

    class Part(Event):
        text: str

    class PartDone(Event):
        summary: str

    class Retrieved(Event):
        question: str
        context: str

    class Sequential(Workflow):
        """Two LLM steps in a row: complete, then chat on the draft."""

        def __init__(self, llm: LLM, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.llm = llm

        @step
        async def draft(self, ev: StartEvent) -> Drafted:
            return Drafted(draft=str(await self.llm.acomplete(f"Draft: {ev.topic}")))

        @step
        async def polish(self, ev: Drafted) -> StopEvent:
            reply = await self.llm.achat([ChatMessage(role="user", content=f"Polish: {ev.draft}")])
            answer = await self.llm.apredict(teola_prompt(), topic=ev.draft[:20])
            return StopEvent(result=(reply.message.content, answer))

    def teola_prompt() -> Any:
        from llama_index.core.prompts import PromptTemplate

        return PromptTemplate("Summarise {topic}")

    class FanOut(Workflow):
        """Fan-out with collect: one event per part, each embedded and summarised."""

        def __init__(self, llm: LLM, embed_model: BaseEmbedding, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.llm = llm
            self.embed_model = embed_model

        @step
        async def split(self, ctx: Context, ev: StartEvent) -> Part | None:
            parts = [f"{ev.topic} part {i}" for i in range(ev.n)]
            await ctx.store.set("n", len(parts))
            for part in parts:
                ctx.send_event(Part(text=part))
            return None

        @step(num_workers=4)
        async def summarise(self, ev: Part) -> PartDone:
            vector = await self.embed_model.aget_query_embedding(ev.text)
            text = await self.llm.acomplete(f"{ev.text} {vector[0]:.4f}")
            return PartDone(summary=str(text))

        @step
        async def collect(self, ctx: Context, ev: PartDone) -> StopEvent | None:
            done = ctx.collect_events(ev, [PartDone] * await ctx.store.get("n"))
            if done is None:
                return None
            return StopEvent(result=sorted(d.summary for d in done))

    class Rag(Workflow):
        """Retrieve, then answer from the nodes; also embeds a batch of texts."""

        def __init__(self, retriever: BaseRetriever, llm: LLM, embed_model: BaseEmbedding, **kw: Any) -> None:
            super().__init__(**kw)
            self.retriever = retriever
            self.llm = llm
            self.embed_model = embed_model

        @step
        async def retrieve(self, ev: StartEvent) -> Retrieved:
            nodes = await self.retriever.aretrieve(ev.question)
            vectors = await self.embed_model.aget_text_embedding_batch([n.node.get_content() for n in nodes])
            context = "\n".join(f"{n.node.node_id} {v[0]:.4f}" for n, v in zip(nodes, vectors, strict=True))
            return Retrieved(question=ev.question, context=context)

        @step
        async def answer(self, ev: Retrieved) -> StopEvent:
            return StopEvent(result=str(await self.llm.acomplete(f"{ev.context}\nQ: {ev.question}")))

    class Embedder(Workflow):
        """One query embedding per run, for the batching test."""

        def __init__(self, embed_model: BaseEmbedding, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.embed_model = embed_model

        @step
        async def embed(self, ev: StartEvent) -> StopEvent:
            return StopEvent(result=await self.embed_model.aget_query_embedding(ev.text))

    class BrokenLLM(MockLLM):
        async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
            raise ValueError(f"model refused: {prompt}")


class Spans:
    def __init__(self) -> None:
        self.spans: list[PrimitiveSpan] = []

    def on_span(self, span: PrimitiveSpan) -> None:
        self.spans.append(span)

    def kinds(self) -> set[PrimitiveKind]:
        return {s.node.kind for s in self.spans}


def optimized(workflow: Any) -> tuple[TeolaWorkflow, Spans]:
    fast = teola.optimize(workflow)
    assert isinstance(fast, TeolaWorkflow)
    spans = Spans()
    fast.add_hook(spans)
    return fast, spans


def test_sequential_steps() -> None:
    wf = Sequential(MockLLM(max_tokens=8))
    fast, spans = optimized(wf)

    async def main() -> tuple[Any, Any]:
        return await wf.run(topic="cats"), await fast.run(topic="cats")

    plain, got = asyncio.run(main())
    assert got == plain
    assert spans.kinds() == {PrimitiveKind.DECODE}
    assert len(spans.spans) == 3  # acomplete, achat, and apredict's call
    assert isinstance(wf.llm, MockLLM)  # the original is untouched
    assert fast.proxied == {"llm": "MockLLM"}
    assert step_depths(wf) == {"draft": 2, "polish": 1}
    assert {s.node.config["teola_depth"] for s in spans.spans} == {1, 2}


def embedding_engine(fast: TeolaWorkflow) -> Any:
    (engine,) = (e for e in fast.engines.engines.values() if PrimitiveKind.EMBED in e.kinds)
    return engine


def test_fan_out_with_collect() -> None:
    wf = FanOut(MockLLM(), HashEmbedding(embed_dim=8))
    fast, spans = optimized(wf)

    async def main() -> tuple[Any, Any]:
        plain = await wf.run(topic="dogs", n=4)
        hold_batches(fast.runtime(), embedding_engine(fast), 4)  # the model is busy until every part's call is in
        return plain, await fast.run(topic="dogs", n=4)

    plain, got = asyncio.run(main())
    assert got == plain and len(got) == 4
    embeds = [s for s in spans.spans if s.node.kind is PrimitiveKind.EMBED]
    assert len(embeds) == 4
    assert max(s.batch_size for s in embeds) >= 2  # the fan-out's embeddings share a batch


def test_rag_with_retriever() -> None:
    index = make_index()
    wf = Rag(index.as_retriever(similarity_top_k=2), MockLLM(), HashEmbedding(embed_dim=8))
    fast, spans = optimized(wf)

    async def main() -> list[tuple[Any, Any]]:
        return [(await wf.run(question=q), await fast.run(question=q)) for q in ("cats", "vector stores")]

    for plain, got in asyncio.run(main()):
        assert got == plain
    assert spans.kinds() == {PrimitiveKind.EMBED, PrimitiveKind.SEARCH, PrimitiveKind.DECODE}
    assert fast.proxied == {"retriever": "VectorIndexRetriever", "llm": "MockLLM", "embed_model": "HashEmbedding"}
    explained = fast.explain()
    assert "- retriever: VectorIndexRetriever" in explained and "== mermaid retrieve on " in explained
    assert "timed primitives of 2 queries" in explained  # the two runs' calls, per engine


def test_a_retrievers_index_nodes_are_resolved_as_its_own_aretrieve_does() -> None:
    wf = Rag(recursive_retriever(), MockLLM(), HashEmbedding(embed_dim=8))
    fast, spans = optimized(wf)

    async def main() -> tuple[Any, Any, Any]:
        nodes = await recursive_retriever().aretrieve("what do cats do at dusk")
        return (
            nodes,
            await wf.run(question="what do cats do at dusk"),
            await fast.run(question="what do cats do at dusk"),
        )

    nodes, plain, got = asyncio.run(main())
    assert any(n.node.get_content() in TEXTS[3:] for n in nodes)  # the sub-index was searched
    assert got == plain
    assert PrimitiveKind.SEARCH in spans.kinds()


def test_concurrent_runs_batch_their_embeddings() -> None:
    wf = Embedder(HashEmbedding(embed_dim=8))
    fast, spans = optimized(wf)
    texts = [f"text {i}" for i in range(6)]

    async def main() -> tuple[list[Any], list[Any]]:
        plain = [await wf.run(text=t) for t in texts]
        hold_batches(fast.runtime(), embedding_engine(fast), len(texts))  # busy until every run's call is in
        return plain, list(await asyncio.gather(*(fast.run(text=t) for t in texts)))

    plain, got = asyncio.run(main())
    assert got == plain
    sizes = [s.batch_size for s in spans.spans if s.node.kind is PrimitiveKind.EMBED]
    assert len(sizes) == len(texts)
    assert max(sizes) >= 2, sizes
    assert len({s.query_id.split("/")[0] for s in spans.spans}) == len(texts)  # keyed by run


def test_error_in_step_reaches_caller() -> None:
    wf = Sequential(BrokenLLM())
    fast, _ = optimized(wf)

    async def run(w: Any) -> BaseException:
        with pytest.raises(ValueError, match="model refused") as info:
            await w.run(topic="x")
        return info.value

    asyncio.run(run(wf))
    error = asyncio.run(run(fast))
    assert type(error) is ValueError


def test_sync_calls_go_to_the_wrapped_model() -> None:
    llm = MockLLM(max_tokens=4)
    fast, _ = optimized(Sequential(llm))
    proxy = fast.workflow.llm
    assert isinstance(proxy, LLM) and proxy.wrapped is llm
    assert proxy.complete("hello").text == llm.complete("hello").text
    assert proxy.metadata == llm.metadata


def test_loop_and_text_batches() -> None:
    """A step that loops on its own event (a cycle in the step graph) and text batches."""

    class Again(Event):
        n: int

    class Loop(Workflow):
        def __init__(self, embed_model: BaseEmbedding, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.embed_model = embed_model

        @step
        async def start(self, ev: StartEvent) -> Again:
            return Again(n=0)

        @step
        async def again(self, ev: Again) -> Again | StopEvent:
            if ev.n < 3:
                return Again(n=ev.n + 1)
            texts = [f"chunk {i}" for i in range(5)]
            return StopEvent(result=await self.embed_model.aget_text_embedding_batch(texts))

    embed_model = HashEmbedding(embed_dim=8, embed_batch_size=2)
    wf = Loop(embed_model)
    assert step_depths(wf) == {"start": 2, "again": 1}
    fast, spans = optimized(wf)

    async def main() -> tuple[Any, list[Any]]:
        return await wf.run(), list(await asyncio.gather(fast.run(), fast.run()))

    plain, got = asyncio.run(main())
    assert got == [plain, plain]
    assert {s.node.kind for s in spans.spans} == {PrimitiveKind.EMBED}


def test_a_workflow_is_on_the_drop_in_kit() -> None:
    """The Workflow row of the drop-in family (`tests/drop_in_family.py`)."""
    from drop_in_family import check_drop_in

    wf = Sequential(MockLLM(max_tokens=8))
    fast = teola.optimize(wf)

    async def run(app: Any) -> Any:
        return await app.run(topic="cats")

    asyncio.run(check_drop_in(wf, fast, run))
    assert fast.where() == {name: "driver" for name in fast.engines.engines}  # the workflow's models
