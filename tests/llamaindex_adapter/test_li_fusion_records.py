"""A `QueryFusionRetriever` runs on Teola's engines by default, and records what plain records.

Its query generation is a PREFILL + DECODE on the LLM's engine made exactly as the library
makes it, inside the fusion retriever's own `retrieve` / `aretrieve` span, events and
RETRIEVE callback event; the sub-retrievals are the sub-retrievers' own calls. Spans with
their arguments and results, events, callback events with payloads and a
`LlamaDebugHandler`'s pairs equal plain's (`_same_as_plain`), sync and async, one query
and concurrent ones, when the model or a sub-retrieval fails, on both llama-index-core
lines (0.12's async path calls the sync `complete`; 0.13 on awaits `acomplete`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from li_fakes import BrokenLLM, HashEmbedding, make_llm
from li_trace import summary
from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.retrievers import QueryFusionRetriever
from test_li_retriever_records import ASK, QUESTIONS, BoomStore, Records, _gathered, _same_as_plain, _threaded

import teola
from teola_core.ir.kinds import PrimitiveKind
from teola_llamaindex import TeolaQueryEngine


def fusion_engine(
    records: Records, *, llm: Any = None, store: Any = None, second: bool = False, **options: Any
) -> RetrieverQueryEngine:
    """A query engine over a fusion retriever whose every part reports to `records`."""
    embed = HashEmbedding if store is not None else None
    vector = records.engine(store=store, **({"embed": embed} if embed else {})).retriever
    retrievers = [vector]
    if second:
        other = vector._index.as_retriever(similarity_top_k=3)
        other.callback_manager = records.manager
        retrievers.append(other)
    model = llm if llm is not None else make_llm(max_tokens=None, callback_manager=records.manager)
    defaults: dict[str, Any] = {"similarity_top_k": 3, "num_queries": 3}
    retriever = QueryFusionRetriever(retrievers, llm=model, callback_manager=records.manager, **{**defaults, **options})
    return RetrieverQueryEngine.from_args(retriever, llm=make_llm(), callback_manager=records.manager)


SHAPES: dict[str, dict[str, Any]] = {
    "simple": {},
    "reciprocal-rerank": {"mode": "reciprocal_rerank"},
    "relative-score-two-retrievers": {"mode": "relative_score", "second": True},
    "no-generation": {"num_queries": 1},
    "sync-sub-retrievals-two-retrievers": {"use_async": False, "second": True},
    "verbose": {"verbose": True},
}


def test_the_query_generation_runs_on_the_llms_engine_by_default() -> None:
    records = Records()

    def kinds(**options: Any) -> list[tuple[PrimitiveKind, str | None]]:
        fast = TeolaQueryEngine(fusion_engine(records), **options)
        fast.close()
        return [(n.kind, n.engine) for n in fast.pgraph.nodes.values() if n.engine is not None]

    default = kinds()
    assert (PrimitiveKind.DECODE, "llm:MockLLM") in default
    assert not any(kind is PrimitiveKind.SEARCH for kind, _ in default)  # no whole fusion call
    whole = kinds(decompose=False)
    assert (PrimitiveKind.SEARCH, "retriever:QueryFusionRetriever") in whole
    assert not any(kind is PrimitiveKind.DECODE for kind, _ in whole if kind)


@pytest.mark.parametrize("api", list(ASK))
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_query_records_what_plain_records(api: str, shape: str) -> None:
    tree = _same_as_plain(lambda r: fusion_engine(r, **SHAPES[shape]), ASK[api](QUESTIONS[0])).tree()
    method = "retrieve" if api == "query" else "aretrieve"
    spans = [e[1] for e in tree if e[0] == "span"]
    assert f"QueryFusionRetriever.{method}" in spans
    if SHAPES[shape].get("num_queries", 3) > 1:
        assert any(name.startswith("MockLLM.") for name in spans)


def test_a_sync_query_from_async_code_records_what_plain_records() -> None:
    async def ask(engine: Any) -> Any:
        return engine.query(QUESTIONS[2])

    _same_as_plain(fusion_engine, lambda engine: asyncio.run(ask(engine)))


@pytest.mark.parametrize("api", list(ASK))
def test_a_failing_query_generation_records_what_plain_records(api: str) -> None:
    records = Records()

    def build(r: Records) -> RetrieverQueryEngine:
        return fusion_engine(r, llm=BrokenLLM(callback_manager=r.manager))

    plain = build(records)
    fast = teola.optimize(build(records))
    try:
        want = records.run(lambda: ASK[api](QUESTIONS[0])(plain))
        got = records.run(lambda: ASK[api](QUESTIONS[0])(fast))
    finally:
        fast.close()
    assert got[0] == want[0] == ("error", "ConnectionError", "model server down")
    assert got[1].tree() == want[1].tree() and got[2] == want[2] and got[3] == want[3]
    method = "retrieve" if api == "query" else "aretrieve"
    assert ("drop", f"QueryFusionRetriever.{method}", "ConnectionError") in [e[:3] for e in got[1].tree()]


@pytest.mark.parametrize("api", list(ASK))
def test_a_failing_sub_retrieval_records_what_plain_records(api: str) -> None:
    tree = _same_as_plain(lambda r: fusion_engine(r, store=BoomStore()), ASK[api]("boom?")).tree()
    assert any(e[0] == "drop" and e[1].startswith("QueryFusionRetriever.") for e in tree)


@pytest.mark.parametrize("how", [_gathered, _threaded], ids=["aquery-gathered", "query-threads"])
def test_concurrent_queries_record_what_plain_records(how: Any) -> None:
    questions = [*QUESTIONS, "boom!"]
    roots = _same_as_plain(lambda r: fusion_engine(r, store=BoomStore()), how(questions), concurrent=True)
    assert len(roots.canonical()[1]) == len(questions)


class ThreadNotingLLM(CustomLLM):
    """Notes, for each `complete`, whether an event loop was running on its thread."""

    on_loop: list[bool]

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(is_chat_model=False)

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        try:
            asyncio.get_running_loop()
            self.on_loop.append(True)
        except RuntimeError:
            self.on_loop.append(False)
        return CompletionResponse(text="cats at dusk\nvector stores")

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise NotImplementedError


def test_an_async_query_never_blocks_the_event_loop_on_the_sync_model_call() -> None:
    """0.12's `_aretrieve` calls the sync `complete` on the loop (every other query waits);
    Teola makes the same call on a worker thread. From 0.13 both await `acomplete`."""
    records = Records()
    plain_llm, fast_llm = ThreadNotingLLM(on_loop=[]), ThreadNotingLLM(on_loop=[])
    plain = fusion_engine(records, llm=plain_llm)
    fast = teola.optimize(fusion_engine(records, llm=fast_llm))
    try:
        want, got = asyncio.run(plain.aquery(QUESTIONS[0])), asyncio.run(fast.aquery(QUESTIONS[0]))
    finally:
        fast.close()
    assert str(got) == str(want) and summary(got.source_nodes) == summary(want.source_nodes)
    if "_aget_queries" in vars(QueryFusionRetriever):  # 0.13 on: `acomplete`, a CustomLLM's runs on the loop
        assert fast_llm.on_loop == plain_llm.on_loop == [True]
    else:
        assert plain_llm.on_loop == [True] and fast_llm.on_loop == [False]
