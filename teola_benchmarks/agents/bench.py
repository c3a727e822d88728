"""`teola bench --agents`: N concurrent agents, plain vs Teola, feature by feature.

    result = run_virtual(bench_agents(concurrency=32, pool_fraction=0.5))       # a share of live contexts
    result = run_virtual(bench_agents(concurrency=64, pool_tokens=H100_KV_TOKENS))  # one fixed machine

Every system runs the same jobs (`trace.make_jobs`) on a fresh simulated LLM whose KV
pool holds `pool_fraction` of the jobs' live contexts (the sum of their mean prompt
lengths; default a third) or a fixed `pool_tokens` (LRU prefix cache, prefill cost per
uncached token). The model is `AGENT_LLM`: an 8B model on one 80 GB H100, whose KV space
(`H100_KV_TOKENS`, ~491k tokens) is about a third of 32 agents' ~49k-token contexts; the
paper's 7B on a 24 GB RTX 3090 holds 16k tokens, not one agent's context.
Systems: `plain` (each call straight to the engine, FIFO, compaction in before_model),
`teola` (every feature), and `teola+FEATURE` with one feature alone. Reported per system:
mean and p95 job completion time (unscaled seconds, from the job's start to its final
answer), prefill tokens recomputed (computed again after eviction), the prefix-cache hit
rate, and that every system's answers equal the plain agent's.

"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from teola_adapters.simulated.llm import SimLLM
from teola_adapters.simulated.prefix_cache import BLOCK_TOKENS
from teola_benchmarks.agents.agent import AgentOutput, PlainBackend, TeolaBackend, run_agent
from teola_benchmarks.agents.trace import AgentJob, Shape, make_jobs, mean_context_tokens
from teola_benchmarks.stats import percentile
from teola_core.agents import AgentFeatures, AgentRuntime
from teola_core.engines.protocol import Engine, EngineSet
from teola_core.profiles.profile import Curve, LatencyProfile

T = TypeVar("T")

POOL_FRACTION = 1 / 3
# 80 GB - 16 GB of weights - ~4 GB of activations = 60 GiB of KV, at 128 KiB a token
# (32 layers x 8 KV heads x 128 dims x K and V x 2 bytes): the fixed pool of `--kv-pool-tokens h100`.
H100_KV_TOKENS = 60 * 2**30 // (128 * 2**10)

AGENT_LLM = LatencyProfile(
    "llm",
    {
        # ~16 GFLOP per token at ~200 TFLOPS sustained: ~12.5k tokens/s, a 10 ms floor per step
        "prefill": Curve(((16, 0.010), (512, 0.050), (2048, 0.170), (8192, 0.670), (32768, 2.650), (65536, 5.300))),
        # 16 GB of weights read at ~3.3 TB/s per step plus overheads; grows slowly with the batch
        "decode": Curve(((1, 0.010), (8, 0.011), (16, 0.013), (32, 0.016), (64, 0.022), (128, 0.034))),
    },
)


def system_names() -> tuple[str, ...]:
    return ("plain", "teola", *(f"teola+{name}" for name in AgentFeatures.names()))


def features_of(system: str) -> AgentFeatures | None:
    """None for the plain agent."""
    if system == "plain":
        return None
    if system == "teola":
        return AgentFeatures()
    prefix = "teola+"
    if system.startswith(prefix) and system[len(prefix) :] in AgentFeatures.names():
        return AgentFeatures.only(system[len(prefix) :])
    raise ValueError(f"unknown agent system {system!r} (known: {', '.join(system_names())})")


@dataclass
class AgentSystemResult:
    jct_s: list[float]
    outputs: list[AgentOutput]
    recomputed_prefill_tokens: int
    prefill_tokens: int
    prefix_hit_rate: float
    tool_cache_hits: int = 0
    kv_holds: int = 0
    compactions_ahead: int = 0

    def summary(self) -> dict[str, float | int]:
        return {
            "mean_s": statistics.fmean(self.jct_s),
            "p95_s": percentile(self.jct_s, 95),
            "recomputed_prefill_tokens": self.recomputed_prefill_tokens,
            "prefill_tokens": self.prefill_tokens,
            "prefix_hit_rate": self.prefix_hit_rate,
            "tool_cache_hits": self.tool_cache_hits,
            "kv_holds": self.kv_holds,
            "compactions_ahead": self.compactions_ahead,
        }


@dataclass
class AgentBenchResult:
    concurrency: int
    kv_pool_tokens: int
    live_context_tokens: int
    systems: dict[str, AgentSystemResult] = field(default_factory=dict)

    @property
    def kv_pool_fraction(self) -> float:
        """The pool over the jobs' live contexts (their mean prompt lengths added up)."""
        return self.kv_pool_tokens / self.live_context_tokens

    def to_json(self) -> dict[str, object]:
        return {
            "concurrency": self.concurrency,
            "kv_pool_tokens": self.kv_pool_tokens,
            "kv_pool_fraction": self.kv_pool_fraction,
            "systems": {name: r.summary() for name, r in self.systems.items()},
        }


def live_context_tokens(jobs: list[AgentJob]) -> int:
    return int(sum(mean_context_tokens(j) for j in jobs))


def kv_pool_tokens(jobs: list[AgentJob], fraction: float = POOL_FRACTION) -> int:
    """`fraction` of the live contexts, and room for one agent's longest call at least.

    A prompt never passes the compaction budget by more than one turn, and a
    summarization prompt is that context plus an instruction: twice the budget holds it.
    """
    floor = max((2 * j.shape.compact_tokens for j in jobs), default=BLOCK_TOKENS)
    return max(floor, int(live_context_tokens(jobs) * fraction)) // BLOCK_TOKENS * BLOCK_TOKENS


async def run_jobs_then_close(
    jobs: list[AgentJob], one: Callable[[AgentJob], Awaitable[T]], agents: AgentRuntime | None, engine: Engine
) -> list[T]:
    """`one` of every job at once; then the agent runtime (if any) and the engine are closed, even on failure."""
    try:
        return await asyncio.gather(*(one(j) for j in jobs))
    finally:
        if agents is not None:
            await agents.close()
        await engine.close()


async def run_system(system: str, jobs: list[AgentJob], pool_tokens: int, time_scale: float) -> AgentSystemResult:
    engine = SimLLM(AGENT_LLM, time_scale=time_scale, cache_tokens=pool_tokens, kv_pool=True)
    loop = asyncio.get_running_loop()
    origin = loop.time()

    def now() -> float:  # unscaled seconds since the run began
        return (loop.time() - origin) / time_scale

    async def sleep(seconds: float) -> None:
        await asyncio.sleep(seconds * time_scale)

    features = features_of(system)
    agents = AgentRuntime(EngineSet().add(engine), features=features, clock=now) if features is not None else None

    async def one(job: AgentJob) -> tuple[float, AgentOutput, tuple[int, int, int]]:
        await asyncio.sleep(job.start_s * time_scale)
        began = now()
        if agents is None:
            output = await run_agent(job, PlainBackend(engine, job.id), sleep)
            return now() - began, output, (0, 0, 0)
        program = agents.program(job.id)
        try:
            output = await run_agent(job, TeolaBackend(program, engine.name), sleep)
        finally:
            program.finish()
        s = program.stats
        return now() - began, output, (s.tool_cache_hits, s.kv_holds, s.compactions_ahead)

    runs = await run_jobs_then_close(jobs, one, agents, engine)
    st = engine.stats
    return AgentSystemResult(
        jct_s=[r[0] for r in runs],
        outputs=[r[1] for r in runs],
        recomputed_prefill_tokens=st.recomputed_tokens,
        prefill_tokens=st.prefill_tokens,
        prefix_hit_rate=st.prefix_hit_rate,
        tool_cache_hits=sum(r[2][0] for r in runs),
        kv_holds=sum(r[2][1] for r in runs),
        compactions_ahead=sum(r[2][2] for r in runs),
    )


async def bench_agents(
    *,
    concurrency: int = 32,
    time_scale: float = 1.0,
    seed: int = 0,
    systems: tuple[str, ...] | None = None,
    shape: Shape | None = None,
    pool_fraction: float = POOL_FRACTION,
    pool_tokens: int | None = None,
) -> AgentBenchResult:
    """Run every system on the same jobs; on `run_virtual`'s loop unless real time is wanted.

    The KV pool: `pool_tokens` if given (one machine for every agent count), else
    `pool_fraction` of the jobs' live contexts.
    """
    names = systems or system_names()
    for name in names:
        features_of(name)  # unknown names fail before anything runs
    if not pool_fraction > 0 or (pool_tokens is not None and pool_tokens < BLOCK_TOKENS):
        raise ValueError(f"the KV pool must be positive and hold a block: {pool_fraction=}, {pool_tokens=}")
    jobs = make_jobs(concurrency, seed=seed, shape=shape)
    pool = (
        pool_tokens // BLOCK_TOKENS * BLOCK_TOKENS if pool_tokens is not None else kv_pool_tokens(jobs, pool_fraction)
    )
    result = AgentBenchResult(concurrency, pool, live_context_tokens(jobs))
    for name in names:
        result.systems[name] = await run_system(name, jobs, result.kv_pool_tokens, time_scale)
    reference_name = names[0]
    reference = [o.answers for o in result.systems[reference_name].outputs]
    for name, r in result.systems.items():
        if [o.answers for o in r.outputs] != reference:
            raise AssertionError(f"agent system {name!r} answered differently than {reference_name!r}")
    return result
