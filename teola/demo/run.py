"""`teola demo`: the multi-query RAG chain on the embedded engines, plain and through Teola.

    result = asyncio.run(run_demo(questions=4, out=Path("teola-demo"), progress=my_progress))
    result.equal, result.speedup, result.timeline

In order: load SmolLM2 on llama.cpp twice (one engine per run, so neither inherits the
other's prefix states), warm both and measure the decode step (any native crash happens
before Postgres starts); load MiniLM and the embedded Postgres; ingest the corpus (or reuse
it); run the chain plain (concurrent `ainvoke`, one per question), then optimized, then
again optimized first and plain second on cold engines (`ORDERS`: each order once, the
figures are the means); check every run's answers are equal (greedy decoding); write the
timeline picture and a JSON of results.
Why one thread per engine: docs/demo.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from teola.demo.chain import QUESTIONS, build_chain
from teola.demo.corpus import Paragraph, ingest, load_corpus
from teola.demo.timeline import Run, call_bars, draw, llama_bars
from teola_core.ir.kinds import PrimitiveKind

RETRIEVE_K = 2  # paragraphs per expanded query
# Each round runs both modes one after the other, the first round plain first, the second
# optimized first: on a shared 2-core host the second run of a pair can be slower for reasons
# outside both (plain vs plain on fresh engines: 0.87-0.95x here), so each order runs once.
ORDERS: tuple[tuple[str, str], ...] = (("plain", "teola"), ("teola", "plain"))
EXPECTED_QUERIES = 3  # what the expansion prompt asks for (a planning hint for decode pipelining)


class Progress(Protocol):
    """What the demo reports while it runs: phases, and progress within one."""

    def start(self, phase: str, total: int | None = None) -> None:
        """A phase begins (the one before is done); `total`: its steps, if counted."""

    def advance(self, n: int = 1) -> None:
        """n more steps of the current phase are done."""


class _Silent:
    def start(self, phase: str, total: int | None = None) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass


@dataclass
class RunTimes:
    """Wall-clock seconds of one mode: all questions together, and each question's own latency."""

    total_s: float
    per_question_s: list[float]

    @property
    def mean_s(self) -> float:
        return sum(self.per_question_s) / len(self.per_question_s)


@dataclass(frozen=True)
class LlamaTime:
    """Where one run's llama.cpp time went (seconds, summed over its instances): reading
    prompts, writing tokens, and idle while the run lasted (waiting on retrieval); `ahead_s`:
    of the reading, prompt prefixes read before the rest of their prompt was known (prefill
    split: the answer prompt's instructions and question, while retrieval ran)."""

    prefill_s: float
    decode_s: float
    idle_s: float
    ahead_s: float = 0.0

    @classmethod
    def of(cls, work: Sequence[Any], total_s: float, instances: int) -> LlamaTime:
        prefill = sum(w.ended - w.began for w in work if w.kind == "prefill")
        decode = sum(w.ended - w.began for w in work if w.kind == "decode")
        ahead = sum(w.ended - w.began for w in work if w.kind == "prefill" and _partial(w))
        return cls(prefill, decode, max(0.0, total_s * instances - prefill - decode), ahead)

    @classmethod
    def mean(cls, times: Sequence[LlamaTime]) -> LlamaTime:
        n = len(times)
        fields = ("prefill_s", "decode_s", "idle_s", "ahead_s")
        return cls(*(sum(getattr(t, f) for t in times) / n for f in fields))


def _partial(work: Any) -> bool:
    """A prefill chunk of a partial prefill (a prefix read ahead of the rest of its prompt)."""
    return bool(work.calls) and all(c.node.kind == PrimitiveKind.PARTIAL_PREFILL for c in work.calls)


@dataclass
class Measured:
    """One run of one mode: its answers, times, llama.cpp time and timeline row."""

    answers: list[str]
    times: RunTimes
    llama: LlamaTime
    run: Run


@dataclass
class Round:
    """Both modes run one after the other, in `order`."""

    order: tuple[str, str]
    runs: dict[str, Measured]  # by mode

    @property
    def plain(self) -> Measured:
        return self.runs["plain"]

    @property
    def teola(self) -> Measured:
        return self.runs["teola"]

    def summary(self) -> dict[str, Any]:
        return {
            "order": list(self.order),
            "plain_s": asdict(self.plain.times),
            "teola_s": asdict(self.teola.times),
            "speedup": self.plain.times.total_s / self.teola.times.total_s,
            "latency_speedup": self.plain.times.mean_s / self.teola.times.mean_s,
            "plain_llama_s": asdict(self.plain.llama),
            "teola_llama_s": asdict(self.teola.llama),
        }


def _pooled(times: Sequence[RunTimes]) -> RunTimes:
    """One mode over the rounds: the mean total and each question's mean latency."""
    n = len(times)
    return RunTimes(
        sum(t.total_s for t in times) / n,
        [sum(t.per_question_s[q] for t in times) / n for q in range(len(times[0].per_question_s))],
    )


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
    results: Path
    pgdata: str  # the embedded Postgres data directory (or the DATABASE_URL server, redacted)
    plain_stats: dict[str, Any]
    teola_stats: dict[str, Any]
    decode_batch: int | None  # decodes teola.optimize let llama.cpp step together (None: by the step cost)
    decode_step_s: dict[int, float] = field(default_factory=dict)  # measured step seconds by sequences
    teola_steps: dict[int, int] = field(default_factory=dict)  # teola.optimize's decode steps by sequences
    plain_steps: dict[int, int] = field(default_factory=dict)
    llm_threads: int = 1
    llm_replicas: int = 1
    rounds: list[dict[str, Any]] = field(default_factory=list)  # each round's order and figures
    plain_llama: LlamaTime | None = None  # where llama.cpp's time went, mean over the rounds
    teola_llama: LlamaTime | None = None
    all_answers_equal: bool = True  # every run of every round answered as plain's first run

    @property
    def equal(self) -> bool:
        return self.plain_answers == self.teola_answers and self.all_answers_equal

    @property
    def speedup(self) -> float:
        return self.plain.total_s / self.teola.total_s

    @property
    def latency_speedup(self) -> float:
        return self.plain.mean_s / self.teola.mean_s


async def _timed(calls: Sequence[Callable[[], Any]], done: Callable[[], None]) -> tuple[list[Any], RunTimes, float]:
    """Start every call at once; their results, latencies and the start (`time.perf_counter`)."""
    began = time.perf_counter()

    async def one(call: Callable[[], Any]) -> tuple[Any, float]:
        result = await call()
        done()
        return result, time.perf_counter() - began

    results = await asyncio.gather(*(one(c) for c in calls))
    return [r for r, _ in results], RunTimes(time.perf_counter() - began, [t for _, t in results]), began


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
    decode_batch: int | None = None,
    paragraphs: list[Paragraph] | None = None,
    progress: Progress | None = None,
) -> DemoResult:
    """Run the demo (see the module docstring).

    torch_threads: torch's thread count while the demo runs (restored after; None: leave it).
    llm_threads: llama.cpp's threads per engine.
    llm_replicas: llama.cpp instances the optimized run spreads queries over (plain: one).
    decode_batch: decodes teola.optimize lets llama.cpp step together (default: as many of
      the ready ones as the decode step's cost, measured at load and while running, says).
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
        raise ValueError(f"questions must be between 1 and {len(QUESTIONS)}, got {questions}")
    report = progress if progress is not None else _Silent()
    corpus = paragraphs if paragraphs is not None else load_corpus()
    asked = list(QUESTIONS[:questions])
    previous_threads = torch.get_num_threads()
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    work: dict[str, list[Any]] = {"plain": [], "teola": []}  # each run's llama.cpp work, for its timeline
    calls: list[tuple[str, float, float]] = []  # embeddings and searches of both runs
    engines: list[Any] = []
    closing: list[Any] = []
    try:
        report.start("loading SmolLM2 on llama.cpp (one per run)")
        plain_engine = LlamaCppEngine(n_threads=llm_threads, on_work=lambda done: work["plain"].append(done))
        engines.append(plain_engine)
        for _ in range(llm_replicas):  # teola.optimize's engine, then its replicas
            engines.append(LlamaCppEngine(n_threads=llm_threads, on_work=lambda done: work["teola"].append(done)))
        teola_engine = engines[1]
        replicas = engines[2:]
        plain_llm = ChatSmolLM(engine=plain_engine, max_tokens=max_tokens)
        teola_llm = ChatSmolLM(engine=teola_engine, max_tokens=max_tokens)
        for engine in engines:
            await _warm(ChatSmolLM(engine=engine, max_tokens=max_tokens))
        report.start("measuring llama.cpp's decode step")
        curve = await calibrate_decode(teola_engine)
        step_s = {int(n): s for n, s in curve.points}
        for replica in replicas:
            await calibrate_decode(replica)

        report.start("loading MiniLM, starting Postgres")
        embedder = SentenceTransformerEmbedder()
        closing.append(embedder)
        store = PgVectorStore(pgdata=pgdata, table=table, hnsw=False)
        closing.append(store)
        where = store.where if store.embedded is None else str(store.embedded.pgdata)
        collection, ingested = await ingest(
            corpus,
            embedder,
            store,
            progress=report.advance,
            starting=lambda: report.start("ingesting the corpus into pgvector", total=len(corpus)),
        )
        if not ingested:
            report.start("corpus already in pgvector: reused", total=1)
            report.advance()
        embeddings = MiniLMEmbeddings(embedder, on_call=lambda *c: calls.append(c))
        vectors = PgVectorCollection(store, collection, embeddings, on_call=lambda *c: calls.append(c))
        retriever = vectors.as_retriever(search_kwargs={"k": RETRIEVE_K})
        await retriever.ainvoke("warm-up")  # the embedder's threads and a database connection
        inputs = [{"question": q} for q in asked]
        chains = {"plain": build_chain(plain_llm, retriever), "teola": build_chain(teola_llm, retriever)}
        labels = {"plain": "plain LangChain", "teola": "teola.optimize"}
        rounds: list[Round] = []
        for number, order in enumerate(ORDERS, 1):
            if number > 1:  # cold again: neither run inherits prefix states from the round before
                for engine in engines:
                    await engine.run_task(engine.sequences.forget)
            measured: dict[str, Measured] = {}
            for mode in order:
                work[mode] = []
                suffix = "" if number == 1 else f" (round {number}, {labels[order[0]]} first)"
                report.start(f"{labels[mode]}: {questions} questions at once{suffix}", total=questions)
                chain = chains[mode]
                if mode == "teola":  # a fresh optimized object each round: nothing learned carries over
                    chain = optimize_native(
                        chains["teola"],
                        replicas=replicas,
                        decode_batch=decode_batch,
                        expected_items=EXPECTED_QUERIES,
                        warn=False,
                    )
                answers, times, began = await _timed(
                    [lambda i=i, c=chain: c.ainvoke(i) for i in inputs], report.advance
                )
                instances = 1 if mode == "plain" else llm_replicas
                measured[mode] = Measured(
                    answers,
                    times,
                    LlamaTime.of(work[mode], times.total_s, instances),
                    _run(f"{labels[mode]}{suffix}", work[mode], calls, began, times, asked),
                )
            rounds.append(Round(order, measured))

        report.start("drawing the timeline")
        plain_times, teola_times = _pooled([r.plain.times for r in rounds]), _pooled([r.teola.times for r in rounds])
        answers_equal = all(m.answers == rounds[0].plain.answers for r in rounds for m in (r.plain, r.teola))
        title = (
            f"teola demo: {questions} questions at once on SmolLM2 (llama.cpp), MiniLM and pgvector\n"
            f"speedup with teola.optimize over {len(rounds)} rounds (each order once): "
            f"{plain_times.total_s / teola_times.total_s:.2f}x in total time, "
            f"{plain_times.mean_s / teola_times.mean_s:.2f}x in mean latency "
            f"({'answers equal' if answers_equal else 'ANSWERS DIFFER'})"
        )
        runs = [r.runs[mode].run for r in rounds for mode in r.order]  # in the order they ran
        timeline = draw(runs, asked, title, out / "teola-demo-timeline.png")
        result = DemoResult(
            questions=asked,
            plain_answers=rounds[0].plain.answers,
            teola_answers=rounds[0].teola.answers,
            plain=plain_times,
            teola=teola_times,
            collection=collection,
            ingested=ingested,
            timeline=timeline,
            results=out / "teola-demo-results.json",
            pgdata=where,
            plain_stats=asdict(plain_engine.stats),
            teola_stats=_summed([asdict(e.stats) for e in engines[1:]]),
            decode_batch=decode_batch,
            decode_step_s=step_s,
            teola_steps=_summed([e.steps_by_size for e in engines[1:]]),
            plain_steps=dict(plain_engine.steps_by_size),
            llm_threads=llm_threads,
            llm_replicas=llm_replicas,
            rounds=[r.summary() for r in rounds],
            plain_llama=LlamaTime.mean([r.plain.llama for r in rounds]),
            teola_llama=LlamaTime.mean([r.teola.llama for r in rounds]),
            all_answers_equal=answers_equal,
        )
        _write_results(result)
        return result
    finally:
        for engine in engines:
            await engine.close()
        for resource in closing:
            await resource.close()
        torch.set_num_threads(previous_threads)


def _run(label: str, work: list[Any], calls: list[Any], began: float, times: RunTimes, asked: list[str]) -> Run:
    end = began + times.total_s
    bars = llama_bars(work, began, asked) + call_bars(calls, began, end)
    return Run(label, bars, times.per_question_s, times.total_s)


def _summed(stats: list[dict[Any, Any]]) -> dict[Any, Any]:
    """Engine stats added up over the instances of one run."""
    keys = {key: None for s in stats for key in s}
    return {key: sum(s.get(key, 0) for s in stats) for key in sorted(keys)}


def _write_results(result: DemoResult) -> None:
    data = {
        "questions": result.questions,
        "plain_answers": result.plain_answers,
        "teola_answers": result.teola_answers,
        "answers_equal": result.equal,
        "plain_s": asdict(result.plain),
        "teola_s": asdict(result.teola),
        "speedup": result.speedup,
        "latency_speedup": result.latency_speedup,
        "plain_llm_stats": result.plain_stats,
        "teola_llm_stats": result.teola_stats,
        "decode_batch": result.decode_batch,
        "decode_step_s": result.decode_step_s,
        "teola_steps_by_sequences": result.teola_steps,
        "plain_steps_by_sequences": result.plain_steps,
        "collection": result.collection,
        "pgdata": result.pgdata,
        "llm_threads": result.llm_threads,
        "teola_llm_instances": result.llm_replicas,
        "rounds": result.rounds,
        "cpus": os.cpu_count(),
    }
    result.results.parent.mkdir(parents=True, exist_ok=True)
    result.results.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
