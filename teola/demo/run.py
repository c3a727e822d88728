"""`teola demo`: the multi-query RAG chain on the embedded engines, plain and through Teola.

What it does, in order: load the bundled corpus; ingest it (MiniLM into the embedded
Postgres + pgvector, skipped when the collection already holds it); run the chain plain
(concurrent `ainvoke`, one per question) and optimized (`optimize_native`, the same);
check the answers are equal (greedy decoding); print both latencies and the speedup;
draw the optimized run's per-primitive timeline.

Both runs get their own, freshly loaded `LlamaCppEngine` (so neither inherits the
other's prefix states) and share the embedder and the database, warmed up first.

Threads: torch runs MiniLM on one thread here. Measured on 2 cores: once torch has run
with 2 threads in the process, llama.cpp decodes at about 30 instead of 100 tokens/s
for the rest of the process (the two OpenMP thread pools fight over the cores), in the
plain and in the optimized run alike; setting torch back to 1 thread afterwards does not
undo it. One torch thread costs MiniLM little (short texts) and keeps llama.cpp at full
speed while embeddings and decodes overlap.

llama.cpp runs on one thread per engine by default. With 2 threads on 2 cores its
per-token barrier spins, so any other busy thread — a second llama.cpp context, torch,
Postgres, another process — collapses its decode (measured: 100 tokens/s alone, about
30 after a second engine ran, 4 with another process busy); with one thread it decodes
steadily and leaves a core for embedding and search, which is the core Teola's overlap
of retrieval with decoding can use. Plain and optimized runs use the same setting.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from teola.demo.chain import QUESTIONS, build_chain
from teola.demo.corpus import Paragraph, ingest, load_corpus
from teola_core.runtime.timeline import SpanRecorder, plot_timeline

RETRIEVE_K = 2  # paragraphs per expanded query
EXPECTED_QUERIES = 3  # what the expansion prompt asks for (a planning hint for decode pipelining)


@dataclass
class RunTimes:
    """Wall-clock seconds of one mode: all questions together, and each question's own latency."""

    total_s: float
    per_question_s: list[float]

    @property
    def mean_s(self) -> float:
        return sum(self.per_question_s) / len(self.per_question_s)


@dataclass
class DemoResult:
    questions: list[str]
    plain_answers: list[str]
    teola_answers: list[str]
    plain: RunTimes
    teola: RunTimes
    collection: str
    ingested: bool
    timeline: Path
    plain_stats: dict[str, Any]
    teola_stats: dict[str, Any]
    llm_threads: int = 1
    llm_replicas: int = 1

    @property
    def equal(self) -> bool:
        return self.plain_answers == self.teola_answers

    @property
    def speedup(self) -> float:
        return self.plain.total_s / self.teola.total_s


async def _timed(calls: Sequence[Callable[[], Any]]) -> tuple[list[Any], RunTimes]:
    """Start every call at once; their results and latencies."""
    began = time.perf_counter()

    async def one(call: Callable[[], Any]) -> tuple[Any, float]:
        result = await call()
        return result, time.perf_counter() - began

    done = await asyncio.gather(*(one(c) for c in calls))
    return [r for r, _ in done], RunTimes(time.perf_counter() - began, [t for _, t in done])


async def _warm(llm: Any) -> None:
    """Load the model's pages and threads with a prompt that shares no chunk with the demo's."""
    await llm.with_config(run_name="warm-up").bind(stop=["\n"]).ainvoke("Hi")


async def run_demo(
    *,
    questions: int = 4,
    out: Path = Path("teola-demo"),
    max_tokens: int = 96,
    pgdata: Path | None = None,
    table: str = "teola_demo",
    torch_threads: int | None = 1,
    llm_threads: int = 1,
    llm_replicas: int = 1,
    paragraphs: list[Paragraph] | None = None,
    progress: Callable[[int, int], None] | None = None,
    decode_batch: int | None = None,
) -> DemoResult:
    """Run the demo (see the module docstring); `progress(done, total)` reports ingestion.

    torch_threads: torch's thread count while the demo runs (restored after; None: leave it).
    llm_threads: llama.cpp's threads per engine (see the module docstring).
    llm_replicas: llama.cpp instances the optimized run spreads queries over (the plain
      chain's model object has one; see `teola.demo.native`).
    paragraphs: the corpus to ingest (default: the bundled one).
    """
    import torch

    from teola.demo.components import ChatSmolLM, MiniLMEmbeddings, PgVectorCollection
    from teola.demo.native import optimize_native
    from teola_adapters.embeddings import SentenceTransformerEmbedder
    from teola_adapters.llamacpp import LlamaCppEngine, calibrate_decode
    from teola_adapters.pgvector import PgVectorStore

    if llm_replicas < 1:
        raise ValueError(f"llm_replicas must be >= 1, got {llm_replicas}")
    if not 1 <= questions <= len(QUESTIONS):
        raise ValueError(f"--questions must be between 1 and {len(QUESTIONS)}, got {questions}")
    corpus = paragraphs if paragraphs is not None else load_corpus()
    previous_threads = torch.get_num_threads()
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    embedder = SentenceTransformerEmbedder()
    store = PgVectorStore(pgdata=pgdata, table=table, hnsw=False)
    engines: list[Any] = []
    try:
        written = 0

        def advance(n: int) -> None:
            nonlocal written
            written += n
            if progress is not None:
                progress(written, len(corpus))

        collection, ingested = await ingest(corpus, embedder, store, progress=advance)
        embeddings = MiniLMEmbeddings(embedder)
        retriever = PgVectorCollection(store, collection, embeddings).as_retriever(search_kwargs={"k": RETRIEVE_K})
        await retriever.ainvoke("warm-up")  # the embedder's threads and a database connection
        asked = list(QUESTIONS[:questions])
        inputs = [{"question": q} for q in asked]

        plain_engine, teola_engine = LlamaCppEngine(n_threads=llm_threads), LlamaCppEngine(n_threads=llm_threads)
        engines += [plain_engine, teola_engine]
        plain_llm = ChatSmolLM(engine=plain_engine, max_tokens=max_tokens)
        teola_llm = ChatSmolLM(engine=teola_engine, max_tokens=max_tokens)
        replicas = [LlamaCppEngine(n_threads=llm_threads) for _ in range(llm_replicas - 1)]
        engines += replicas
        await _warm(plain_llm)
        for engine in (teola_engine, *replicas):
            await _warm(ChatSmolLM(engine=engine, max_tokens=max_tokens))
        if decode_batch is None:
            await calibrate_decode(teola_engine)

        plain_chain = build_chain(plain_llm, retriever)
        plain_answers, plain_times = await _timed([lambda i=i: plain_chain.ainvoke(i) for i in inputs])

        recorder = SpanRecorder()
        fast = optimize_native(
            build_chain(teola_llm, retriever),
            hooks=[recorder],
            replicas=replicas,
            decode_batch=decode_batch,
            expected_items=EXPECTED_QUERIES,
            warn=False,
        )
        teola_answers, teola_times = await _timed([lambda i=i: fast.ainvoke(i) for i in inputs])

        roots: dict[str, float] = {}
        for span in recorder.spans:
            root = span.query_id.split("/")[0]
            roots[root] = min(roots.get(root, span.ready_at), span.ready_at)
        labels = {q: f"Q{n + 1}: {asked[n][:40]}" for n, q in enumerate(sorted(roots, key=roots.__getitem__))}
        timeline = plot_timeline(
            recorder.spans,
            labels,
            out / "teola-demo-timeline.png",
            f"teola demo: {questions} questions through teola.optimize ({teola_times.total_s:.2f} s; "
            f"plain LangChain {plain_times.total_s:.2f} s)",
        )
        result = DemoResult(
            asked,
            plain_answers,
            teola_answers,
            plain_times,
            teola_times,
            collection,
            ingested,
            timeline,
            asdict(plain_engine.stats),
            _summed([asdict(e.stats) for e in (teola_engine, *replicas)]),
            llm_threads,
            llm_replicas,
        )
        _write_results(result, out / "teola-demo-results.json")
        return result
    finally:
        for engine in engines:
            await engine.close()
        await embedder.close()
        await store.close()
        torch.set_num_threads(previous_threads)


def _summed(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Engine stats added up over the instances of one run."""
    return {key: sum(s[key] for s in stats) for key in stats[0]}


def _write_results(result: DemoResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "questions": result.questions,
        "plain_answers": result.plain_answers,
        "teola_answers": result.teola_answers,
        "answers_equal": result.equal,
        "plain_s": asdict(result.plain),
        "teola_s": asdict(result.teola),
        "speedup": result.speedup,
        "plain_llm_stats": result.plain_stats,
        "teola_llm_stats": result.teola_stats,
        "collection": result.collection,
        "llm_threads": result.llm_threads,
        "teola_llm_instances": result.llm_replicas,
    }
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
