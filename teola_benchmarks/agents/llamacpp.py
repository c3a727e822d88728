"""`teola bench --agents --engines local-real`: the agent benchmark on a real model, in real time.

    result = asyncio.run(bench_agents_llamacpp(concurrency=4))
    result.to_json()      # per system: mean/p95 JCT, prompt, evaluated and recomputed tokens

The simulated benchmark's loop and jobs on the embedded llama.cpp engine (SmolLM2-135M,
one thread), tools scaled by `tool_time_scale`; every system's answers must equal the
first system's (`mismatches`). What it models and why: `docs/benchmarks.md`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from teola_adapters.llamacpp import LlamaCppEngine
from teola_benchmarks.agents.agent import AgentOutput, Backend, PlainBackend, Summarize, TeolaBackend, run_agent
from teola_benchmarks.agents.bench import AgentSystemResult, features_of, run_jobs_then_close
from teola_benchmarks.agents.trace import AgentJob, Shape, ToolCall, make_jobs, mean_context_tokens
from teola_core.agents import AgentRuntime
from teola_core.engines.protocol import EngineSet

SMALL_SHAPE = Shape(
    system_tokens=120,  # words (~360 tokens): the shared system + tool-schema block
    task_tokens=30,
    answer_tokens=24,  # the model's tokens a call (its max_tokens)
    result_tokens=40,
    mean_turns=4,
    max_turns=6,
    compact_tokens=300,  # words (~900 tokens): a prompt plus one turn stays within n_ctx
    summary_tokens=32,
)
SYSTEMS = ("plain", "teola")
N_CTX = 2048
MAX_SEQUENCES = 2
TOOL_TIME_SCALE = 0.1
SPREAD_S = 5.0  # unscaled, like the tool durations
TOKENS_PER_WORD = 3.0  # SmolLM2's tokenizer on the benchmark's pseudo-words (measured: 2.96)
STATE_BYTES_PER_TOKEN = 23_000  # a saved SmolLM2 sequence state (measured: 23.05 KB a token)
POOL_FRACTION = 1.0
HOLD_FRACTION = 3 / 4


@dataclass
class RealAgentSystemResult(AgentSystemResult):
    prompt_tokens: int = 0  # of the model calls: the prefill work if nothing were reused
    decode_tokens: int = 0
    kv_holds_refused: int = 0
    wall_s: float = 0.0  # the whole run, first start to last answer

    def summary(self) -> dict[str, float | int]:
        return {
            **super().summary(),
            "prompt_tokens": self.prompt_tokens,
            "reused_prefill_tokens": self.prompt_tokens - self.prefill_tokens,
            "decode_tokens": self.decode_tokens,
            "kv_holds_refused": self.kv_holds_refused,
            "wall_s": self.wall_s,
        }


@dataclass
class RealAgentBenchResult:
    concurrency: int
    cache_tokens: int
    tool_time_scale: float
    systems: dict[str, RealAgentSystemResult] = field(default_factory=dict)
    mismatches: dict[str, str] = field(default_factory=dict)  # system -> where its answers first differ

    def to_json(self) -> dict[str, object]:
        return {
            "concurrency": self.concurrency,
            "engine": "llamacpp",
            "kv_cache_tokens": self.cache_tokens,
            "tool_time_scale": self.tool_time_scale,
            "answers_identical": not self.mismatches,
            "mismatches": dict(self.mismatches),
            "systems": {name: r.summary() for name, r in self.systems.items()},
        }


class CountingBackend:
    """A backend that counts its model calls' prompt tokens with the engine's tokenizer."""

    def __init__(self, inner: Backend, engine: LlamaCppEngine) -> None:
        self._inner = inner
        self._engine = engine
        self.prompt_tokens = 0

    async def model(self, prompt: str, max_tokens: int, *, background: bool = False) -> str:
        self.prompt_tokens += self._engine.count_tokens(prompt)
        return await self._inner.model(prompt, max_tokens, background=background)

    async def tool(self, call: ToolCall, run: Callable[[], Awaitable[str]]) -> str:
        return await self._inner.tool(call, run)

    def waiting_on_tools(self, key: str, summarize: Summarize) -> None:
        self._inner.waiting_on_tools(key, summarize)

    async def compacted(self, key: str, summarize: Summarize) -> str:
        return await self._inner.compacted(key, summarize)


def cache_tokens(jobs: list[AgentJob], fraction: float = POOL_FRACTION) -> int:
    """`fraction` of the jobs' mean contexts, in model tokens."""
    return int(fraction * TOKENS_PER_WORD * sum(mean_context_tokens(j) for j in jobs))


async def run_real_system(
    system: str,
    jobs: list[AgentJob],
    *,
    pool_tokens: int,
    tool_time_scale: float,
    n_threads: int,
    max_sequences: int,
) -> RealAgentSystemResult:
    """One system on a fresh engine (cold caches), in real time."""
    features = features_of(system)
    pool_bytes = pool_tokens * STATE_BYTES_PER_TOKEN
    engine = LlamaCppEngine(
        n_ctx=N_CTX,
        n_threads=n_threads,
        max_sequences=max_sequences,
        cache_bytes=pool_bytes,
        hold_bytes=int(pool_bytes * HOLD_FRACTION),
    )
    agents = AgentRuntime(EngineSet().add(engine), features=features) if features is not None else None
    counters: list[CountingBackend] = []

    async def sleep(seconds: float) -> None:
        await asyncio.sleep(seconds * tool_time_scale)

    async def one(job: AgentJob) -> tuple[float, AgentOutput, tuple[int, int, int, int]]:
        await asyncio.sleep(job.start_s * tool_time_scale)
        began = time.monotonic()
        if agents is None:
            backend = CountingBackend(PlainBackend(engine, job.id), engine)
            counters.append(backend)
            output = await run_agent(job, backend, sleep)
            return time.monotonic() - began, output, (0, 0, 0, 0)
        program = agents.program(job.id)
        backend = CountingBackend(TeolaBackend(program, engine.name), engine)
        counters.append(backend)
        try:
            output = await run_agent(job, backend, sleep)
        finally:
            program.finish()
        s = program.stats
        counts = (s.tool_cache_hits, s.kv_holds, s.kv_holds_refused, s.compactions_ahead)
        return time.monotonic() - began, output, counts

    started = time.monotonic()
    runs = await run_jobs_then_close(jobs, one, agents, engine)
    wall = time.monotonic() - started
    st = engine.stats
    prompt_tokens = sum(c.prompt_tokens for c in counters)
    return RealAgentSystemResult(
        jct_s=[r[0] for r in runs],
        outputs=[r[1] for r in runs],
        recomputed_prefill_tokens=st.recomputed_tokens,
        prefill_tokens=st.computed_tokens,
        prefix_hit_rate=1 - st.computed_tokens / prompt_tokens if prompt_tokens else 0.0,
        tool_cache_hits=sum(r[2][0] for r in runs),
        kv_holds=sum(r[2][1] for r in runs),
        compactions_ahead=sum(r[2][3] for r in runs),
        prompt_tokens=prompt_tokens,
        decode_tokens=st.decode_tokens,
        kv_holds_refused=sum(r[2][2] for r in runs),
        wall_s=wall,
    )


def first_difference(reference: list[AgentOutput], outputs: list[AgentOutput], jobs: list[AgentJob]) -> str | None:
    """Where `outputs` first answers differently than `reference` (None: identical)."""
    for job, ref, out in zip(jobs, reference, outputs, strict=True):
        for i, (a, b) in enumerate(zip(ref.answers, out.answers, strict=False)):
            if a != b:
                return f"{job.id} model call {i + 1}: {a!r} vs {b!r}"
        if len(ref.answers) != len(out.answers):
            return f"{job.id}: {len(ref.answers)} vs {len(out.answers)} model calls"
    return None


async def bench_agents_llamacpp(
    *,
    concurrency: int = 4,
    seed: int = 0,
    systems: tuple[str, ...] = SYSTEMS,
    shape: Shape = SMALL_SHAPE,
    tool_time_scale: float = TOOL_TIME_SCALE,
    n_threads: int = 1,
    max_sequences: int = MAX_SEQUENCES,
    pool_fraction: float = POOL_FRACTION,
) -> RealAgentBenchResult:
    """Run every system, one after the other, on the same jobs; answers compared with the first's."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if tool_time_scale <= 0:
        raise ValueError(f"tool_time_scale must be > 0, got {tool_time_scale}")
    for name in systems:
        features_of(name)  # unknown names fail before anything runs
    jobs = make_jobs(concurrency, seed=seed, spread_s=SPREAD_S, shape=shape)
    result = RealAgentBenchResult(concurrency, cache_tokens(jobs, pool_fraction), tool_time_scale)
    for name in systems:
        result.systems[name] = await run_real_system(
            name,
            jobs,
            pool_tokens=result.cache_tokens,
            tool_time_scale=tool_time_scale,
            n_threads=n_threads,
            max_sequences=max_sequences,
        )
    reference = result.systems[systems[0]].outputs
    for name, r in result.systems.items():
        where = first_difference(reference, r.outputs, jobs)
        if where is not None:
            result.mismatches[name] = where
    return result
