"""The simulated LLM's bookkeeping: its statistics, the step loop's requests and state, call inputs."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from itertools import count
from typing import Any

from teola_core.engines.protocol import Call
from teola_core.ir.types import KVHandle
from teola_core.scheduler.server_costs import TOKEN_GAP_BOUNDS


def gap_bucket(seconds: float) -> float:
    """The upper bound of vLLM's inter-token latency bucket that `seconds` falls in."""
    return next((bound for bound in TOKEN_GAP_BOUNDS if seconds <= bound), math.inf)


@dataclass
class LLMStats:
    """What the engine did. `prompt_tokens = prefill_tokens + cache_hit_tokens + handle_hit_tokens`."""

    prefills: int = 0
    decodes: int = 0
    prompt_tokens: int = 0  # tokens of every prefilled prompt
    prefill_tokens: int = 0  # of which computed
    cache_hit_tokens: int = 0  # of which reused from the prefix cache (whole blocks)
    handle_hit_tokens: int = 0  # of which reused from a FULL_PREFILL's prefix_kv beyond the cache
    recomputed_tokens: int = 0  # of the computed ones, those in blocks the cache had held and evicted
    pool_waits: int = 0  # steps whose next prefill waited for room in the KV pool (kv_pool mode)
    decode_tokens: int = 0  # tokens generated (one per sequence per step)
    steps: int = 0
    max_running: int = 0  # most sequences decoding in one step
    busy_s: float = 0.0  # simulated, unscaled seconds spent in steps
    prefill_s: float = 0.0  # each prefill's step's seconds, summed (vLLM's request prefill time)
    token_gap_s: float = 0.0  # each decode token's step's seconds, summed (vLLM's inter-token latency)
    token_gaps: Counter[float] = field(default_factory=Counter)  # decode tokens by their step's seconds,
    # in vLLM's inter-token latency buckets (keyed by the bucket's upper bound)

    @property
    def prefix_hit_rate(self) -> float:
        """Share of prompt tokens not computed (reused from the cache or a handle); 0 without prompts."""
        if not self.prompt_tokens:
            return 0.0
        return (self.cache_hit_tokens + self.handle_hit_tokens) / self.prompt_tokens

    @classmethod
    def combined(cls, parts: Iterable[LLMStats]) -> LLMStats:
        """The stats of several instances added up (`max_running`: the largest)."""
        total = cls()
        for part in parts:
            for f in fields(cls):
                mine, theirs = getattr(total, f.name), getattr(part, f.name)
                setattr(total, f.name, max(mine, theirs) if f.name == "max_running" else mine + theirs)
        return total


@dataclass(eq=False)
class PrefillJob:
    tokens: list[str]
    handle_tokens: int  # tokens reusable from the request's own prefix handle
    needs_logits: bool
    future: asyncio.Future[None]
    keys: list[int] | None = None  # its blocks' cache keys, hashed once (a job may wait many steps)


@dataclass(eq=False)
class DecodeSequence:
    prompt: str  # the KV handle's prompt: its blocks and the produced text's are cached at the end
    pieces: list[str]
    keys: tuple[int, ...] | None = None  # pool mode: its prompt's blocks, in use while it runs
    request: int | None = None  # pool mode: set while its blocks are in use
    future: asyncio.Future[None] | None = None  # run(): resolved when the last token is out
    queue: asyncio.Queue[str | BaseException | None] | None = None  # stream(): pieces, then None
    emitted: int = 0
    closed: bool = False  # the stream's consumer went away

    @property
    def steps(self) -> int:
        return max(1, len(self.pieces))

    @property
    def abandoned(self) -> bool:
        return self.closed or (self.future is not None and self.future.cancelled())

    def advance(self) -> bool:
        """Produce one token; True when the sequence is finished."""
        if self.queue is not None and self.emitted < len(self.pieces):
            self.queue.put_nowait(self.pieces[self.emitted])
        self.emitted += 1
        if self.emitted < self.steps:
            return False
        if self.future is not None and not self.future.done():
            self.future.set_result(None)
        if self.queue is not None:
            self.queue.put_nowait(None)
        return True

    def fail(self, error: BaseException) -> None:
        if self.future is not None and not self.future.done():
            self.future.set_exception(error)
        if self.queue is not None:
            self.queue.put_nowait(error)


@dataclass(eq=False)
class StepLoopState:
    """The step loop's state on one event loop (asyncio objects bind to their loop)."""

    loop: asyncio.AbstractEventLoop
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: list[tuple[float, int, PrefillJob]] = field(default_factory=list)  # heap by (priority, arrival)
    arrivals: count[int] = field(default_factory=count)
    running: list[DecodeSequence] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    room_short: bool = False  # the last admission stopped for want of room in the KV pool


def priority_of(value: Any) -> float:
    """A node's `priority` config: a number (lower runs first)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"a prefill's priority must be a number, got {value!r}")
    if math.isnan(value):
        raise ValueError("a prefill's priority must be a number, got NaN")
    return float(value)


def pool_keys(call: Call) -> tuple[int, ...] | None:
    """The prompt's block keys a decode's KV handle carries (kv_pool mode), if any."""
    kv = call.inputs.get("kv")
    token = kv.token if isinstance(kv, KVHandle) else None
    return token if isinstance(token, tuple) else None


def text_input(value: Any, port: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"the simulated LLM takes text prompts; {port} is {type(value).__name__}")
    return value
