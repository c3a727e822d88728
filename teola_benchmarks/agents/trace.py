"""Agent jobs drawn from published trace figures (the figures and their sources: `docs/benchmarks.md`).

jobs = make_jobs(32, seed=0)   # repeatable for a seed; starts within the first `spread_s` seconds
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

SYSTEM_TOKENS = 6_000
TASK_TOKENS = 4_000
ANSWER_TOKENS = 659
RESULT_TOKENS = 3_400
MEAN_TURNS = 21.9
MAX_TURNS = 300
COMPACT_TOKENS = 64_000  # context that triggers a compaction (half a 128k window)
SUMMARY_TOKENS = 1_000
TOOL_P50_S = 0.3
TOOL_P90_S = 13.6
TOOL_CAP_S = 216.0
SHARED_DOCS = 64
SHARED_READ_P = 0.2
PARALLEL_P = 1 / 8

_SIGMA = (math.log(TOOL_P90_S) - math.log(TOOL_P50_S)) / 1.2815515655446004  # z of the 90th percentile


@dataclass(frozen=True)
class Shape:
    """Token sizes of a job (the trace's by default; smaller for a real small model)."""

    system_tokens: int = SYSTEM_TOKENS
    task_tokens: int = TASK_TOKENS
    answer_tokens: int = ANSWER_TOKENS
    result_tokens: int = RESULT_TOKENS
    mean_turns: float = MEAN_TURNS
    max_turns: int = MAX_TURNS
    compact_tokens: int = COMPACT_TOKENS
    summary_tokens: int = SUMMARY_TOKENS


@dataclass(frozen=True)
class ToolCall:
    tool: str  # "read_doc" (idempotent, shared documents) or "run_step" (job-specific)
    args: tuple[tuple[str, str], ...]
    seconds: float
    result_tokens: int

    @property
    def idempotent(self) -> bool:
        return self.tool == "read_doc"

    def arguments(self) -> dict[str, str]:
        return dict(self.args)


@dataclass(frozen=True)
class AgentJob:
    """One agent's job: its task and, per turn but the last, the tools the model calls."""

    id: str
    task_seed: int
    start_s: float
    turns: tuple[tuple[ToolCall, ...], ...]  # one entry per model call except the final answer
    shape: Shape

    @property
    def model_calls(self) -> int:
        return len(self.turns) + 1


def tool_seconds(rng: random.Random) -> float:
    return min(TOOL_CAP_S, math.exp(math.log(TOOL_P50_S) + _SIGMA * rng.gauss(0.0, 1.0)))


def _result_tokens(rng: random.Random, mean: int) -> int:
    return max(1, int(rng.uniform(0.25, 1.75) * mean))


def make_jobs(n: int, *, seed: int = 0, spread_s: float = 5.0, shape: Shape | None = None) -> list[AgentJob]:
    """`n` jobs (deterministic in `seed`)."""
    shape = shape or Shape()
    rng = random.Random(seed)
    p_stop = 1 / shape.mean_turns
    jobs = []
    for i in range(n):
        calls = 1
        while calls < shape.max_turns and rng.random() >= p_stop:
            calls += 1
        turns = []
        for t in range(calls - 1):
            width = 2 if rng.random() < PARALLEL_P else 1
            turn = []
            for k in range(width):
                if rng.random() < SHARED_READ_P:
                    doc = rng.randrange(SHARED_DOCS)
                    size = _result_tokens(random.Random(f"doc-{doc}"), shape.result_tokens)
                    turn.append(ToolCall("read_doc", (("doc", f"doc-{doc}"),), tool_seconds(rng), size))
                else:
                    args = (("job", str(i)), ("step", f"{t}.{k}"))
                    turn.append(ToolCall("run_step", args, tool_seconds(rng), _result_tokens(rng, shape.result_tokens)))
            turns.append(tuple(turn))
        jobs.append(AgentJob(f"agent{i}", rng.randrange(1 << 30), rng.uniform(0.0, spread_s), tuple(turns), shape))
    return jobs


def mean_context_tokens(job: AgentJob) -> float:
    """The job's mean prompt length over its calls, in words (for sizing the KV pool)."""
    s = job.shape
    size, total = s.system_tokens + s.task_tokens, 0.0
    for turn in job.turns:
        total += size
        size += s.answer_tokens + sum(c.result_tokens for c in turn)
    total += size
    return total / job.model_calls
