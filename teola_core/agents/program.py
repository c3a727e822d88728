"""One agent run as Teola sees it: a graph that grows while the agent runs.

The paper optimizes a graph known before the query starts; an agent's graph is known one
step at a time. Each model call the agent issues becomes a small graph (prefill and
decode on an engine), optimized by the passes on its own (the new frontier) and run by
the shared runtime; each tool call becomes a `call` primitive appended after it. The
program keeps every step, so `graph()` shows the e-graph as it has grown so far.

What the program remembers for the policies:

- `started`: program-level FCFS (a returning agent goes before agents that came later);
- `attained_s`: model time the program has had (PLAS, Autellix);
- `last_text`: the last model call's prompt + answer, the KV worth holding while a tool
  runs, because the next prompt starts with it (append-only prompts).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from teola_core.agents.host import ProgramHost
from teola_core.ir.builder import GraphBuilder
from teola_core.ir.graph import Graph, GraphEditor
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.node import ControlEdge, Node, Port
from teola_core.ir.types import PortType

if TYPE_CHECKING:
    from teola_core.agents.admission import ProgramAdmission

T = TypeVar("T")

log = logging.getLogger(__name__)

BACKGROUND_PRIORITY = 10**15
"""Added to a program's priority for work nobody waits on yet (speculative compaction)."""


@dataclass
class Compaction:
    """A speculative compaction: the summary of exactly `key`, computed off the critical path."""

    key: str
    task: asyncio.Task[Any]


@dataclass
class Step:
    """One model or tool call of the program, as run."""

    kind: str  # "model" or "tool"
    name: str
    graph: Graph
    started: float
    ended: float
    cached: bool = False


@dataclass
class ProgramStats:
    model_calls: int = 0
    tool_calls: int = 0
    tool_cache_hits: int = 0
    kv_holds: int = 0  # holds the engine accepted
    kv_holds_refused: int = 0
    compactions_ahead: int = 0  # compactions used that were computed during a tool wait
    compactions_on_path: int = 0
    admission_waits: int = 0  # model calls that waited for older programs to make room
    admission_wait_s: float = 0.0


@dataclass(eq=False)
class Program:
    """One agent run. Make it with `AgentRuntime.program()`; call `finish()` at the end."""

    runtime: ProgramHost
    id: str
    started: float
    rank: int = 0  # order of start among the runtime's programs
    attained_s: float = 0.0
    last_text: str | None = None
    last_engine: str | None = None
    steps: list[Step] = field(default_factory=list)
    stats: ProgramStats = field(default_factory=ProgramStats)
    _holding: str | None = None  # engine holding our KV
    _compaction: Compaction | None = None
    finished: bool = False

    # -- priority ---------------------------------------------------------------------
    def priority(self, *, background: bool = False) -> int:
        """Lower runs first: the program's order of start (FCFS, Continuum's program-level
        order) or its attained model time in microseconds (PLAS, Autellix); without the
        feature: the call's order of issue. An int, because vLLM's priority is one."""
        rt = self.runtime
        if not rt.features.priority:
            base = rt.next_call_rank()
        elif rt.priority_rule == "plas":
            base = round(self.attained_s * 1e6)
        else:
            base = self.rank
        return base + (BACKGROUND_PRIORITY if background else 0)

    # -- model calls -------------------------------------------------------------------
    async def generate(
        self, prompt: Any, *, engine: str, max_tokens: int, background: bool = False, **sampling: Any
    ) -> Any:
        """One model call on `engine`: prefill + decode, optimized and run by the runtime.

        Returns the decode's `text` output (a string for text engines; whatever the
        engine returns for framework models). Releases this program's KV hold once the
        call has taken the KV over.
        """
        self._check_open()
        rt = self.runtime
        priority = self.priority(background=background)
        b = GraphBuilder(f"{self.id}/model{self.stats.model_calls}")
        source = b.input("prompt", PortType.ANY)
        out = b.llm(source, engine=engine, max_tokens=max_tokens, name="model", priority=priority, **sampling)
        b.output(text=out.text)
        graph = rt.optimize(b.build())
        admitted = await self._admit(engine, prompt, max_tokens)
        began = rt.clock()
        self.stats.model_calls += 1
        try:
            outputs = await rt.runtime.run(
                graph,
                {"prompt": prompt},
                query_id=f"{self.id}/model{self.stats.model_calls}",
                arrival=priority,
            )
        finally:
            if admitted is not None:
                admitted.done(self.id)
            ended = rt.clock()
            if not background:
                self.attained_s += ended - began
                self._release()
        self.steps.append(Step("model", engine, graph, began, ended))
        text = outputs["text"]
        if not background:
            self.last_engine = engine
            self.last_text = prompt + text if isinstance(prompt, str) and isinstance(text, str) else None
        return text

    # -- tool calls --------------------------------------------------------------------
    async def call_tool(
        self,
        tool: str,
        args: Mapping[str, Any],
        run: Callable[[], Awaitable[T]],
        *,
        idempotent: bool = False,
        version: str = "",
    ) -> T:
        """Run one tool call of the agent; hold its KV meanwhile (TTL), cache if idempotent."""
        self._check_open()
        rt = self.runtime
        self.stats.tool_calls += 1
        if rt.features.kv_retention:
            self._hold_for(tool)
        began = rt.clock()
        ran = False

        async def timed() -> tuple[T, float]:
            nonlocal ran
            ran = True
            began = rt.clock()
            result = await run()
            return result, rt.clock() - began

        if idempotent and rt.features.tool_cache:
            result, seconds = await rt.tool_cache.get_or_run(tool, args, version, timed)
        else:
            result, seconds = await timed()
        cached = not ran
        if cached:
            self.stats.tool_cache_hits += 1
        else:
            rt.durations.observe(tool, seconds)
        self.steps.append(Step("tool", tool, _tool_graph(self.id, len(self.steps), tool), began, rt.clock(), cached))
        return result

    # -- compaction --------------------------------------------------------------------
    def compact_ahead(self, key: str, summarize: Callable[[], Awaitable[str]]) -> None:
        """Start summarizing `key` now, off the critical path (the agent waits on a tool).

        `summarize` must compute exactly what the agent's own compaction would for the
        same `key`; `compacted` uses the result only for an identical key.
        """
        self._check_open()
        if not self.runtime.features.compaction:
            return
        self._drop_compaction()
        self._compaction = Compaction(key, asyncio.get_running_loop().create_task(summarize()))

    async def compacted(self, key: str, summarize: Callable[[], Awaitable[str]]) -> str:
        """The summary of `key`: the one started ahead (awaited if still running), else now.

        A compaction started ahead for the same input is the computation the agent needs,
        already under way, so it is awaited rather than started again; one for another
        input is cancelled (the agent moved on) and the summary is computed on the path.
        """
        ahead = self._compaction
        self._compaction = None
        if ahead is not None and ahead.key == key:
            try:
                summary = await ahead.task  # raises what the summarization raised
            except asyncio.CancelledError:
                if ahead.task.cancelled() and not _current_task_cancelling():
                    return await self._compact_on_path(summarize)
                raise
            self.stats.compactions_ahead += 1
            return summary
        if ahead is not None:
            _discard(ahead.task)
        return await self._compact_on_path(summarize)

    async def _compact_on_path(self, summarize: Callable[[], Awaitable[str]]) -> str:
        self.stats.compactions_on_path += 1
        return await summarize()

    # -- end ---------------------------------------------------------------------------
    def finish(self) -> None:
        """The agent is done: drop its hold and any compaction nobody will use."""
        if self.finished:
            return
        self.finished = True
        self._release()
        if self.runtime.features.kv_retention:
            self.runtime.discard_private_kv(self)
        self._drop_compaction()
        self.runtime.forget(self)

    def graph(self) -> Graph:
        """The program's e-graph so far: every step's graph, chained in the order they ran."""
        editor = GraphEditor(name=self.id)
        previous: str | None = None
        for i, step in enumerate(self.steps):
            prefix = f"{i}:"
            for node in step.graph.nodes.values():
                editor.add_node(replace(node, id=prefix + node.id))
            for e in step.graph.data_edges:
                editor.connect(replace(e, src=prefix + e.src, dst=prefix + e.dst))
            for c in step.graph.control_edges:
                editor.connect(replace(c, src=prefix + c.src, dst=prefix + c.dst))
            first = prefix + step.graph.topological_order[0]
            if previous is not None:
                editor.connect(ControlEdge(previous, first, pinned=True))
            previous = prefix + step.graph.topological_order[-1]
        return editor.freeze()

    # -- internals ---------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.finished:
            raise RuntimeError(f"agent program {self.id!r} has finished")

    async def _admit(self, engine: str, prompt: Any, max_tokens: int) -> ProgramAdmission | None:
        """Wait, if older programs' contexts fill the engine's KV pool (`ProgramAdmission`).
        Returns the admission the call entered (it must be told when the call is `done`)."""
        rt = self.runtime
        admission = rt.admission(engine)
        tokens = rt.count_tokens(engine, prompt) if admission is not None else None
        if admission is None or tokens is None:
            return None
        admission.set_context(self.id, rank=self.rank, tokens=tokens + max_tokens)
        waits = not admission.may_call(self.id)
        began = rt.clock()
        await admission.call(self.id)
        if waits:
            self.stats.admission_waits += 1
            self.stats.admission_wait_s += rt.clock() - began
        return admission

    def _hold_for(self, tool: str) -> None:
        """Hold the last call's KV on its engine for the tool's time to live."""
        rt = self.runtime
        engine = rt.retention(self.last_engine)
        if engine is None or self.last_text is None or self.last_engine is None:
            return
        reload_s = engine.reload_seconds(self.last_text) or 0.0
        ttl = rt.durations.ttl(tool, reload_s=reload_s, queue_s=rt.queue_delay_s())
        if self._holding == self.last_engine and ttl <= 0:
            return  # a parallel tool call of the same turn already holds it
        if engine.retain(self.id, self.last_text, ttl):
            self._holding = self.last_engine
            self.stats.kv_holds += 1
        elif ttl > 0:
            self.stats.kv_holds_refused += 1

    def _release(self) -> None:
        if self._holding is not None:
            engine = self.runtime.retention(self._holding)
            if engine is not None:
                engine.release(self.id)
            self._holding = None

    def _drop_compaction(self) -> None:
        if self._compaction is not None:
            _discard(self._compaction.task)
            self._compaction = None


def _discard(task: asyncio.Task[Any]) -> None:
    """Cancel a compaction nobody will use; if it already failed, its error is read and
    logged here (nobody awaits it, and the agent computes what it needs on the path)."""
    task.cancel()
    task.add_done_callback(_log_unused_failure)


def _log_unused_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.info("a compaction started ahead failed and was not used: %r", task.exception())


def _current_task_cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _tool_graph(program: str, index: int, tool: str) -> Graph:
    """A one-node graph recording a tool call (the call ran outside the runtime)."""
    editor = GraphEditor(name=f"{program}/tool{index}")
    editor.add_node(
        Node(
            id=f"tool:{tool}",
            kind=PrimitiveKind.CALL,
            inputs=(Port("args", PortType.ANY),),
            outputs=(Port("value", PortType.ANY),),
            config={"tool": tool},
            label=f"tool {tool}",
        )
    )
    return editor.freeze()
