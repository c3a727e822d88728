"""The simulated agent: one ReAct loop, run plain or through Teola's agent runtime.

The loop is the same code for every system; only the backend differs, so identical
outputs are a property of the runs, checked by the benchmark, not assumed:

    prompt = system+tools block, task                       (append-only from here on)
    per turn: [compact if over budget] -> model -> tools (in parallel) -> append results
    last turn: model writes the final answer

Compaction follows the append-only form too: the summarization prompt is the old
context followed by an instruction (so a held KV serves it), and the new context is
the shared block, the task, the summary, then the last turn (its answer and results).
The plain agent compacts in `before_model`, on the critical path, as LangChain's
`SummarizationMiddleware` does; Teola starts the same summarization while the agent
waits on its tools, once the context before the tools already passes the budget.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from teola_adapters.simulated.text import tokens_of
from teola_benchmarks.agents.trace import AgentJob, Shape, ToolCall
from teola_core.agents.program import Program
from teola_core.engines.protocol import Call, Engine
from teola_core.ir.builder import GraphBuilder
from teola_core.ir.node import Node
from teola_core.ir.types import PortType

SUMMARIZE = "\n### Summarize the conversation above for the agent to continue its task.\nSummary:"
_VOCABULARY = tuple(f"{stem}{i}" for stem in ("ra", "to", "mek", "sil", "van", "ob", "dur", "ix") for i in range(100))

Summarize = Callable[[], Awaitable[str]]


def words(seed: object, n: int) -> str:
    """n deterministic pseudo-words (the simulated tokenizer counts words)."""
    return " ".join(random.Random(str(seed)).choices(_VOCABULARY, k=n))


def system_block(shape: Shape) -> str:
    """The shared system + tool-schema block every job's prompt starts with."""
    return "### System and tools\n" + words("system-and-tools", shape.system_tokens)


def tool_result(call: ToolCall) -> str:
    return f"\n### Result of {call.tool}({', '.join(f'{k}={v}' for k, v in call.args)}):\n" + words(
        call.args, call.result_tokens
    )


class Backend(Protocol):
    async def model(self, prompt: str, max_tokens: int, *, background: bool = False) -> str: ...
    async def tool(self, call: ToolCall, run: Callable[[], Awaitable[str]]) -> str: ...
    def waiting_on_tools(self, key: str, summarize: Summarize) -> None: ...
    async def compacted(self, key: str, summarize: Summarize) -> str: ...


@dataclass
class AgentOutput:
    answers: list[str] = field(default_factory=list)  # every model answer, in order
    compactions: int = 0


async def run_agent(job: AgentJob, backend: Backend, sleep: Callable[[float], Awaitable[None]]) -> AgentOutput:
    """One job: `sleep(seconds)` waits a tool's (unscaled) duration."""
    shape = job.shape
    parts = [system_block(shape), "\n### Task\n" + words(job.task_seed, shape.task_tokens)]
    out = AgentOutput()
    tail_start = len(parts)  # where the last turn (answer + results) begins
    for turn in (*job.turns, None):
        prompt = "".join(parts)
        if len(tokens_of(prompt)) > shape.compact_tokens and tail_start > 2:
            head = "".join(parts[:tail_start])
            summary = await backend.compacted(head, _summarizer(backend, head, shape.summary_tokens))
            parts = [*parts[:2], "\n### Summary\n" + summary, *parts[tail_start:]]
            tail_start = 3
            out.compactions += 1
            prompt = "".join(parts)
        answer = await backend.model(prompt, shape.answer_tokens)
        out.answers.append(answer)
        if turn is None:
            break
        tail_start = len(parts)
        parts.append(answer)
        if len(tokens_of("".join(parts))) > shape.compact_tokens and tail_start > 2:
            head = "".join(parts[:tail_start])
            backend.waiting_on_tools(head, _summarizer(backend, head, shape.summary_tokens))
        results = await asyncio.gather(*(backend.tool(c, _tool_run(c, sleep)) for c in turn))
        parts.extend(results)
    return out


def _summarizer(backend: Backend, head: str, max_tokens: int, *, background: bool = False) -> Summarize:
    async def summarize() -> str:
        return await backend.model(head + SUMMARIZE, max_tokens, background=background)

    return summarize


def _tool_run(call: ToolCall, sleep: Callable[[float], Awaitable[None]]) -> Callable[[], Awaitable[str]]:
    async def run() -> str:
        await sleep(call.seconds)
        return tool_result(call)

    return run


class PlainBackend:
    """The agent as frameworks run it: each call straight to the model server, FIFO."""

    def __init__(self, engine: Engine, job_id: str) -> None:
        self._engine = engine
        self._job = job_id
        self._nodes: dict[int, tuple[Node, Node]] = {}
        self._calls = 0

    async def model(self, prompt: str, max_tokens: int, *, background: bool = False) -> str:
        prefill, decode = self._llm_nodes(max_tokens)
        self._calls += 1
        qid = f"{self._job}/{self._calls}"
        kv = (await self._engine.run_one(Call(qid, prefill, {"prompt": prompt})))["kv"]
        text = (await self._engine.run_one(Call(qid, decode, {"kv": kv})))["text"]
        assert isinstance(text, str)
        return text

    async def tool(self, call: ToolCall, run: Callable[[], Awaitable[str]]) -> str:
        return await run()

    def waiting_on_tools(self, key: str, summarize: Summarize) -> None:
        return None  # compaction happens in before_model

    async def compacted(self, key: str, summarize: Summarize) -> str:
        return await summarize()

    def _llm_nodes(self, max_tokens: int) -> tuple[Node, Node]:
        if max_tokens not in self._nodes:
            b = GraphBuilder("plain")
            out = b.llm(b.input("prompt", PortType.ANY), engine=self._engine.name, max_tokens=max_tokens)
            b.output(text=out.text)
            nodes = b.build().nodes
            self._nodes[max_tokens] = (nodes["llm.prefill"], nodes["llm.decode"])
        return self._nodes[max_tokens]


class TeolaBackend:
    """The same agent through Teola's agent runtime (one `Program` per job)."""

    def __init__(self, program: Program, engine: str) -> None:
        self._program = program
        self._engine = engine

    async def model(self, prompt: str, max_tokens: int, *, background: bool = False) -> str:
        text = await self._program.generate(prompt, engine=self._engine, max_tokens=max_tokens, background=background)
        assert isinstance(text, str)
        return text

    async def tool(self, call: ToolCall, run: Callable[[], Awaitable[str]]) -> str:
        return await self._program.call_tool(call.tool, call.arguments(), run, idempotent=call.idempotent)

    def waiting_on_tools(self, key: str, summarize: Summarize) -> None:
        self._program.compact_ahead(key, summarize)

    async def compacted(self, key: str, summarize: Summarize) -> str:
        return await self._program.compacted(key, summarize)
