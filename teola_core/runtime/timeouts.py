"""How long a runtime lets a step run before it fails that step's query.

    LocalRuntime(engines)                                   # defaults: 600 s each
    LocalRuntime(engines, timeouts=Timeouts(engine_s=30, step_s=5))
    LocalRuntime(engines, timeouts=Timeouts.of(30))         # both 30 s (`optimize(timeout=30)`)
    EngineLimits(timeout_s=120)                             # one engine's own, over the runtime's

The defaults match the OpenAI client's own (600 s), so an optimized app never gives up on
a slow model earlier than the original would; `math.inf` means no limit. A step past its
deadline fails its own query with a `TimeoutError` naming the step; other queries go on.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from teola_core.engines.protocol import EngineLimits
from teola_core.ir.node import Node

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Timeouts:
    """engine_s: an engine batch or stream, unless the engine's `EngineLimits.timeout_s`
    sets its own. step_s: a user step (a `call` or a condition's predicate)."""

    engine_s: float = DEFAULT_TIMEOUT_S
    step_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in ("engine_s", "step_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or math.isnan(value) or value <= 0:
                raise ValueError(f"Timeouts.{name} must be a number of seconds > 0 (math.inf: none), got {value!r}")

    @classmethod
    def of(cls, value: float | Timeouts | None) -> Timeouts:
        """None: the defaults; a number: that many seconds for engines and steps alike."""
        if value is None:
            return cls()
        if isinstance(value, Timeouts):
            return value
        return cls(engine_s=value, step_s=value)

    def for_engine(self, limits: EngineLimits) -> float:
        """The deadline of one of this engine's batches."""
        return self.engine_s if limits.timeout_s is None else limits.timeout_s


class DeadlineExpired(Exception):
    """Raised by `within` when the work ran past its deadline; the runtime then fails the
    step with a `TimeoutError` that names it (`step_timeout`). Its cause is asyncio's."""


async def within(work: Awaitable[T], timeout: float) -> T:
    """`await work`, raising `DeadlineExpired` past `timeout` seconds (`math.inf`: no limit)."""
    if math.isinf(timeout):
        return await work
    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            return await work
    except TimeoutError as exc:
        if scope.expired():
            raise DeadlineExpired() from exc
        raise


def step_timeout(
    node: Node,
    timeout: float,
    expired: DeadlineExpired,
    *,
    engine: str | None = None,
    own_limit: bool = False,
    batch: int = 1,
) -> TimeoutError:
    """The `TimeoutError` a step past its deadline fails with: it names the step and the setting."""
    if engine is None:
        where, knob = "", "the runtime's Timeouts.step_s"
    else:
        shared = f", in a batch of {batch} calls" if batch > 1 else ""
        where = f" on engine {engine!r}{shared}"
        knob = "the engine's EngineLimits.timeout_s" if own_limit else "the runtime's Timeouts.engine_s"
    error = TimeoutError(f"step {node.describe()} ran past its {timeout:g} s timeout{where} ({knob})")
    error.__cause__ = expired.__cause__
    return error
