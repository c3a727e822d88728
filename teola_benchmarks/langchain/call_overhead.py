"""Teola's own cost per call on zero-latency LangChain chains, method by method.

    table = measure_call_overhead(calls=200, rounds=5)
    print(table.to_json())

Two chains with no latency of their own (so every microsecond is framework cost): ten
`RunnableLambda`s in a sequence, and `prompt | FakeListChatModel | StrOutputParser`. Each
is called plain and through `teola.optimize` with `invoke`, `ainvoke`, `batch` (4 inputs)
and `abatch` (4 inputs), in alternating rounds so both systems see the same machine
state; the figure is the wall time per call of each system's fastest round (as `timeit`
reports: slower rounds measure other processes), and Teola's results must equal
LangChain's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import teola
from teola_benchmarks.framework_result import AnswerMismatch, TeolaVsLangChain
from teola_benchmarks.framework_runs import alternating_rounds

METHODS = ("invoke", "ainvoke", "batch", "abatch")
BATCH = 4  # inputs per batch/abatch call


def ten_lambdas() -> Any:
    from langchain_core.runnables import RunnableLambda

    chain = RunnableLambda(lambda x: x + 1)
    for _ in range(9):
        chain = chain | RunnableLambda(lambda x: x + 1)
    return chain


def prompt_model_parser() -> Any:
    from langchain_core.language_models import FakeListChatModel
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate

    prompt = ChatPromptTemplate.from_messages([("system", "Answer briefly."), ("human", "{question}")])
    return prompt | FakeListChatModel(responses=["an answer"]) | StrOutputParser()


CHAINS: dict[str, tuple[Callable[[], Any], Callable[[int], Any]]] = {
    "ten_lambdas": (ten_lambdas, lambda i: i),
    "prompt_model_parser": (prompt_model_parser, lambda i: {"question": f"question {i}?"}),
}


@dataclass(frozen=True)
class CallOverhead(TeolaVsLangChain):
    """Seconds per call of one chain and method (fastest round), plain and optimized."""

    chain: str
    method: str
    langchain_s: float
    teola_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "chain": self.chain,
            "method": self.method,
            "langchain_us": self.langchain_s * 1e6,
            "teola_us": self.teola_s * 1e6,
            "ratio": self.ratio,
        }


@dataclass(frozen=True)
class CallOverheadTable:
    calls: int
    rounds: int
    rows: tuple[CallOverhead, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": "call_overhead",
            "calls": self.calls,
            "rounds": self.rounds,
            "rows": [r.to_json() for r in self.rows],
        }


def _call(runnable: Any, method: str, inputs: list[Any]) -> Callable[[], Any]:
    """One call of `method` (a closure the timer runs); async methods on a fresh loop per round."""
    if method == "invoke":
        return lambda: [runnable.invoke(x) for x in inputs]
    if method == "batch":
        return lambda: [runnable.batch(inputs[i : i + BATCH]) for i in range(0, len(inputs), BATCH)]

    async def many() -> list[Any]:
        if method == "ainvoke":
            return [await runnable.ainvoke(x) for x in inputs]
        return [await runnable.abatch(inputs[i : i + BATCH]) for i in range(0, len(inputs), BATCH)]

    return lambda: asyncio.run(many())


def _calls_made(method: str, inputs: list[Any]) -> int:
    return len(inputs) if method in ("invoke", "ainvoke") else -(-len(inputs) // BATCH)


def measure_call_overhead(calls: int = 200, rounds: int = 7) -> CallOverheadTable:
    """Every chain x method, `calls` inputs a round, LangChain and Teola alternating."""
    rows: list[CallOverhead] = []
    for name, (build, make_input) in CHAINS.items():
        chain = build()
        fast = teola.optimize(chain)
        try:
            inputs = [make_input(i) for i in range(calls)]
            for method in METHODS:
                plain_run, teola_run = _call(chain, method, inputs), _call(fast, method, inputs)
                if plain_run() != teola_run():  # also the warm-up: threads, imports, the first plan
                    raise AnswerMismatch(f"{name}.{method}: teola and langchain differ")
                seconds = alternating_rounds({"langchain": plain_run, "teola": teola_run}, rounds)
                n = _calls_made(method, inputs)
                rows.append(CallOverhead(name, method, min(seconds["langchain"]) / n, min(seconds["teola"]) / n))
        finally:
            fast.close()
    return CallOverheadTable(calls, rounds, tuple(rows))
