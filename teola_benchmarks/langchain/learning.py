"""Learned latencies vs given ones: a RAG chain whose prompt starts with a long, per-query document.

The chain (issue 18): a custom `BaseRetriever` that takes `retrieval_s` (0.3 s), and a
`ChatOpenAI` on the simulated vLLM-like server (`servers.SimServers`) whose prompt is
about 1,500 tokens, the first ~1,200 of them (instructions, a user-supplied document,
the question) ready before retrieval and different for every query, so the server's
prefix cache cannot already hold them:

    {"context": itemgetter("question") | SlowRetriever() | format_docs,
     "question": itemgetter("question"), "document": itemgetter("document")}
    | prompt | ChatOpenAI(base_url=...) | StrOutputParser()

Systems, one query at a time, interleaved round by round (so machine load hits each
alike), each query with its own document (no system profits from another's cache):

- `langchain`: `chain.ainvoke`;
- `learned`: `teola.optimize(chain)`, no profiles: the plan learns the retriever's
  latency from the first calls (`warmups` of them, untimed) and then warms the ready
  start of the prompt into the server's prefix cache while the retriever runs;
- `given`: `teola.optimize(chain, profiles=...)` with the retriever's latency and the
  model's profile given by hand (the same warm-ups, untimed).

    python -m teola_benchmarks.langchain.learning --queries 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from operator import itemgetter
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable

import teola
from teola_adapters.simulated.paper_profiles import LLM
from teola_adapters.simulated.servers import SimServers
from teola_adapters.simulated.text import corpus_words, make_chunks, make_question
from teola_core.profiles.profile import Curve, LatencyProfile

SYSTEM = "You are a careful assistant. Answer from the user's document and the retrieved context only."
PROMPT = ChatPromptTemplate.from_messages(
    [("system", SYSTEM), ("human", "Document:\n{document}\n\nQuestion: {question}\n\nContext:\n{context}")]
)
READY_TOKENS = 1200  # the prompt's start that is ready before retrieval
CONTEXT_CHUNKS, CHUNK_WORDS = 3, 100  # ~300 retrieved tokens


class SlowRetriever(BaseRetriever):
    """A user's own retriever: a fixed delay, then `k` chunks chosen by the query's words."""

    chunks: list[str]
    delay_s: float = 0.3
    k: int = CONTEXT_CHUNKS

    def _pick(self, query: str) -> list[Document]:
        start = sum(map(ord, query)) % len(self.chunks)
        return [Document(page_content=self.chunks[(start + i) % len(self.chunks)]) for i in range(self.k)]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        time.sleep(self.delay_s)
        return self._pick(query)

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        await asyncio.sleep(self.delay_s)
        return self._pick(query)


def format_docs(docs: Sequence[Document]) -> str:
    return "\n\n".join(d.page_content for d in docs)


def build_chain(base_url: str, retrieval_s: float = 0.3, max_tokens: int = 48) -> Runnable[dict[str, str], str]:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=base_url, api_key="x", model="sim-7b", temperature=0, max_tokens=max_tokens)
    retriever = SlowRetriever(chunks=make_chunks("learned-kb", 64, CHUNK_WORDS), delay_s=retrieval_s)
    fields = {
        "context": itemgetter("question") | retriever | format_docs,
        "question": itemgetter("question"),
        "document": itemgetter("document"),
    }
    return fields | PROMPT | llm | StrOutputParser()


def query(seed: str) -> dict[str, str]:
    """A question and a document that make the prompt's ready start ~`READY_TOKENS` tokens."""
    question = make_question(seed)
    around = len(f"{SYSTEM} Document: Question: {question} Context:".split()) + 3  # + the chat template's tags
    return {"question": question, "document": " ".join(corpus_words(f"doc/{seed}", READY_TOKENS - around))}


def given_profiles(retrieval_s: float) -> dict[str, LatencyProfile]:
    """What a user who measured the app would give: the retriever's latency and the model's profile."""
    return {
        "SlowRetriever": LatencyProfile("SlowRetriever", {"run": Curve(((1, retrieval_s),))}),
        "llm:ChatOpenAI": LLM,
    }


@dataclass
class LearningResult:
    time_scale: float
    retrieval_s: float
    warmups: int
    queries: int
    mean_s: dict[str, float]
    p50_s: dict[str, float]
    ready_prefill_s: float  # the server's prefill time of the ready start, by its profile
    learned_plan_after: int | None  # calls after which the learned plan warmed prompts
    warm_ups: dict[str, int]  # warm-up requests each Teola system sent in the measured queries
    answers_equal: bool

    def summary(self) -> str:
        lc, learned, given = (self.mean_s[s] for s in ("langchain", "learned", "given"))
        return (
            f"mean latency over {self.queries} queries (after {self.warmups} warm-ups), time scale "
            f"{self.time_scale}: LangChain {lc:.3f} s, Teola learned {learned:.3f} s, Teola given {given:.3f} s; "
            f"learned/given {learned / given:.3f}x; LangChain - learned {lc - learned:.3f} s "
            f"(prefill of the ready {READY_TOKENS} tokens: {self.ready_prefill_s:.3f} s); "
            f"warm-ups sent {self.warm_ups}; answers equal: {self.answers_equal}"
        )


def _warmups(fast: Any) -> int:
    return int(fast._engines.engines["llm:ChatOpenAI"].warmer.stats.warmups)


async def run(time_scale: float = 1.0, retrieval_s: float = 0.3, warmups: int = 5, queries: int = 10) -> LearningResult:
    with SimServers(time_scale=time_scale) as servers:
        chain = build_chain(servers.base_url, retrieval_s)
        learned = teola.optimize(chain, warn=False)
        given = teola.optimize(chain, profiles=given_profiles(retrieval_s), warn=False)
        systems: dict[str, Any] = {"langchain": chain, "learned": learned, "given": given}
        planned_after = None
        for i in range(warmups):
            for name in ("learned", "given", "langchain"):
                await systems[name].ainvoke(query(f"warm/{name}/{i}"))
            if planned_after is None and learned.on_graph:
                planned_after = i + 1
        sent = {"learned": _warmups(learned), "given": _warmups(given)}
        times: dict[str, list[float]] = {name: [] for name in systems}
        order = list(systems)
        for i in range(queries):
            for name in order[i % 3 :] + order[: i % 3]:  # rotate who goes first
                began = time.perf_counter()
                await systems[name].ainvoke(query(f"q/{name}/{i}"))
                times[name].append(time.perf_counter() - began)
        sent = {name: _warmups(systems[name]) - n for name, n in sent.items()}
        same = query("same")
        answers = []
        for system in systems.values():
            answers.append(await system.ainvoke(same))
        learned.close()
        given.close()
    return LearningResult(
        time_scale=time_scale,
        retrieval_s=retrieval_s,
        warmups=warmups,
        queries=queries,
        mean_s={n: statistics.mean(t) for n, t in times.items()},
        p50_s={n: statistics.median(t) for n, t in times.items()},
        ready_prefill_s=LLM.latency("prefill", READY_TOKENS) * time_scale,
        learned_plan_after=planned_after,
        warm_ups=sent,
        answers_equal=len(set(answers)) == 1,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m teola_benchmarks.langchain.learning", description=__doc__)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--retrieval-s", type=float, default=0.3)
    parser.add_argument("--warmups", type=int, default=5)
    parser.add_argument("--queries", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args.time_scale, args.retrieval_s, args.warmups, args.queries))
    print(json.dumps(asdict(result), indent=2) if args.json else result.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
