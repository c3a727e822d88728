"""The agent runtime: many agents' growing graphs on one set of engines.

The paper's stated limit is static workflows. Agents decide their next step only when
the model answers, so Teola takes their graph one step at a time (`Program`): every
model call is optimized as a small frontier graph and run on the shared `LocalRuntime`,
whose engine schedulers see all agents' calls at once. Around the calls, the runtime
applies what a static optimizer cannot:

- KV retention: while an agent waits on a tool, its last call's KV is held on engines
  that can (`KVRetention`) for a time to live computed from the observed tool
  durations (`ToolDurations`, Continuum's rule), so the next call evaluates only the new
  tokens; the engine refuses holds under memory pressure;
- priority by program: every call of an agent carries its program's start (FCFS, as
  Continuum orders its queue) or attained model time (PLAS, Autellix), so an agent
  returning from a tool is not stuck behind agents that arrived later;
- a result cache for tools declared idempotent, with identical in-flight calls merged;
- compaction off the critical path: the agent's summarization runs while it waits on a
  tool, at background priority, and is used only for exactly the same input;
- admission by KV working set: when the agents' contexts do not fit an engine's KV
  pool, only the oldest programs whose contexts fit may call the model; the others wait
  before their next call instead of evicting everyone's context in turn
  (`ProgramAdmission`). A finished program's private KV is discarded first.

Each feature can be turned off (`AgentFeatures`), which is how the benchmark measures
them one at a time.

    agents = AgentRuntime(engines)
    program = agents.program()
    text = await program.generate(prompt, engine="llm", max_tokens=64)
    result = await program.call_tool("search", {"q": "x"}, lambda: search("x"), idempotent=True)
    program.finish()
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from itertools import count
from typing import Any, Literal

from teola_core.agents.admission import ProgramAdmission
from teola_core.agents.host import AgentFeatures
from teola_core.agents.program import Program
from teola_core.agents.tool_cache import ToolResultCache
from teola_core.agents.ttl import ToolDurations
from teola_core.engines.protocol import EngineSet
from teola_core.engines.retention import KVPool, KVRetention
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import PrimitiveKind
from teola_core.passes import PassManager, default_passes
from teola_core.passes.base import Pass, PassContext
from teola_core.runtime.base import PrimitiveSpan, Runtime
from teola_core.runtime.local import LocalRuntime


class QueueDelay:
    """The mean time a model call's prefill took from dispatch to done, recently (EMA).

    Continuum's T: what a program pays to get back into the running set; the prefill
    span covers the engine's waiting queue and the (re)computation.
    """

    def __init__(self, engines: Sequence[str], weight: float = 0.2) -> None:
        self._engines = frozenset(engines)
        self._weight = weight
        self.mean_s = 0.0
        self._seen = False

    def on_span(self, span: PrimitiveSpan) -> None:
        if span.node.kind not in (PrimitiveKind.PREFILL, PrimitiveKind.FULL_PREFILL) or span.error is not None:
            return
        if span.node.engine not in self._engines:
            return
        seconds = span.ended_at - span.ready_at
        self.mean_s = seconds if not self._seen else self.mean_s + self._weight * (seconds - self.mean_s)
        self._seen = True


class AgentRuntime:
    """Runs agent programs' model calls on shared engines; see the module docstring.

    engines: the engines by name. features: which optimizations apply. priority_rule:
    "fcfs" (program start) or "plas" (least attained model time first). passes: the
    passes run on each new frontier (default: Teola's four). clock: seconds, shared by
    the runtime, the tool timings and the TTLs (the engines' holds use their own clock).
    overcommit: how many times an engine's KV pool the admitted programs' contexts may
    add up to (admission needs an engine that reports its pool and counts tokens).
    runtime: the `Runtime` that runs the programs' graphs (default: a `LocalRuntime` over
    `engines` on `clock`); any backend's, e.g. `make_runtime(engines, "ray")`.
    """

    def __init__(
        self,
        engines: EngineSet,
        *,
        features: AgentFeatures | None = None,
        priority_rule: Literal["fcfs", "plas"] = "fcfs",
        passes: Sequence[Pass] | None = None,
        clock: Callable[[], float] = time.monotonic,
        overcommit: float = 1.0,
        runtime: Runtime | None = None,
    ) -> None:
        if priority_rule not in ("fcfs", "plas"):
            raise ValueError(f"unknown priority rule {priority_rule!r} (known: fcfs, plas)")
        self.engines = engines
        self.features = features or AgentFeatures()
        self.priority_rule = priority_rule
        self.clock = clock
        self.runtime = runtime if runtime is not None else LocalRuntime(engines, policy="topology", clock=clock)
        self.durations = ToolDurations()
        self.tool_cache = ToolResultCache()
        self._queue = QueueDelay([n for n, e in engines.engines.items() if isinstance(e, KVRetention)])
        self.runtime.add_hook(self._queue)
        self._manager = PassManager(list(default_passes()) if passes is None else list(passes))
        self._context = PassContext.of(engines)
        self._programs: dict[str, Program] = {}
        self._ids = count()
        self._ranks = count()  # programs, by start
        self._call_ranks = count()  # model calls, by issue (priority feature off)
        self.overcommit = overcommit
        self._admissions: dict[str, ProgramAdmission] = {}  # made on first use: a pool is sized once the engine runs

    def program(self, program_id: str | None = None) -> Program:
        """Start one agent run (ids must be unique among running programs)."""
        pid = program_id if program_id is not None else f"agent{next(self._ids)}"
        if pid in self._programs:
            raise ValueError(f"agent program {pid!r} is already running")
        program = Program(self, pid, started=self.clock(), rank=next(self._ranks))
        self._programs[pid] = program
        return program

    @property
    def programs(self) -> dict[str, Program]:
        """Running programs by id."""
        return dict(self._programs)

    def optimize(self, frontier: Graph) -> Graph:
        """The passes on one new frontier (a model call's graph), not the whole program."""
        return self._manager.optimize(frontier, self._context).e_graph

    def retention(self, engine: str | None) -> KVRetention | None:
        """The engine, if it can hold KV between calls."""
        if engine is None or engine not in self.engines:
            return None
        candidate = self.engines[engine]
        return candidate if isinstance(candidate, KVRetention) else None

    def admission(self, engine: str) -> ProgramAdmission | None:
        """The engine's program admission, when the feature is on and the engine has a `KVPool`."""
        if not self.features.admission or engine not in self.engines:
            return None
        admission = self._admissions.get(engine)
        pool = self.engines[engine]
        if admission is None and isinstance(pool, KVPool):
            capacity = pool.kv_capacity_tokens()
            if capacity:
                admission = self._admissions[engine] = ProgramAdmission(capacity, overcommit=self.overcommit)
        return admission

    def count_tokens(self, engine: str, prompt: Any) -> int | None:
        """The prompt's KV tokens on `engine`, if the engine can tell."""
        pool = self.engines.engines.get(engine)
        return pool.count_tokens(prompt) if isinstance(pool, KVPool) else None

    def discard_private_kv(self, program: Program) -> None:
        """The program finished: its KV past what other running programs share (the
        system and tool block, say) goes first when the engine evicts."""
        engine_name = program.last_engine
        engine = self.retention(engine_name)
        text = program.last_text
        if engine is None or not isinstance(text, str):
            return
        others = (p.last_text for p in self._programs.values() if p is not program and p.last_engine == engine_name)
        shared = max((_common_prefix_chars(text, other) for other in others if isinstance(other, str)), default=0)
        engine.discard(text, text[:shared])

    def next_call_rank(self) -> int:
        return next(self._call_ranks)

    def queue_delay_s(self) -> float:
        return self._queue.mean_s

    async def close(self) -> None:
        for program in list(self._programs.values()):
            program.finish()
        await self.runtime.close()

    def forget(self, program: Program) -> None:
        """A finished program leaves the runtime's records and every admission queue."""
        if self._programs.get(program.id) is program:
            del self._programs[program.id]
            for admission in self._admissions.values():
                admission.leave(program.id)


def _common_prefix_chars(a: str, b: str) -> int:
    """Length of the longest common prefix (binary search on slices: C speed on long prompts)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low
