"""How many items an engine's batch may carry: from its profile and its limits.

default_max_batch(engine)          # the profile's max efficient batch, capped by the limit
max_batch(engine, override=8)      # a runtime's override, still capped by the limit
batch_cost(engine, hard_limit)     # the batch latency by items, from the profile
"""

from __future__ import annotations

import math
from collections.abc import Callable

from teola_core.engines.protocol import Engine
from teola_core.ir.kinds import PrimitiveKind

# The kinds whose profile curve is measured over a batch's items or sequences (a
# prefill's is over tokens), in the order an engine's main one is chosen.
BATCH_CURVE_KINDS = (
    PrimitiveKind.EMBED,
    PrimitiveKind.SEARCH,
    PrimitiveKind.RERANK,
    PrimitiveKind.INGEST,
    PrimitiveKind.DECODE,
)


def _capped(limit: int | None, hard: int | None) -> int | None:
    if limit is None:
        return hard
    return limit if hard is None else min(limit, hard)


def _main_kind(engine: Engine) -> PrimitiveKind | None:
    """The first of `BATCH_CURVE_KINDS` the engine runs and has a profile curve for."""
    profile = engine.profile
    if profile is None:
        return None
    for kind in BATCH_CURVE_KINDS:
        if kind.value in profile.curves and (not engine.kinds or kind in engine.kinds):
            return kind
    return None


def batch_cost(engine: Engine, hard_limit: int | None) -> Callable[[int], float] | None:
    """An engine's batch latency by items: its profile's curve for its main kind, `inf` past
    `hard_limit` (None without a profile: batches are then formed by size alone)."""
    kind, profile = _main_kind(engine), engine.profile
    if kind is None or profile is None:
        return None
    op = kind.value
    return lambda items: math.inf if hard_limit is not None and items > hard_limit else profile.latency(op, items)


def default_max_batch(engine: Engine, tolerance: float = 0.1) -> int | None:
    """The max efficient batch of the engine's main kind (the first of `BATCH_CURVE_KINDS`
    it runs and has a curve for), else `EngineLimits.max_batch_items`, else None
    (unbounded); never above `max_batch_items`."""
    hard = engine.limits.max_batch_items
    profile = engine.profile
    if profile is not None:
        for kind in BATCH_CURVE_KINDS:
            if kind.value in profile.curves and (not engine.kinds or kind in engine.kinds):
                return _capped(profile.max_efficient_batch(kind.value, tolerance), hard)
    return hard


def max_batch(engine: Engine, override: int | None, *, overridden: bool) -> int | None:
    """`override` when `overridden` (None: unbounded), else the default; capped by the limit."""
    if not overridden:
        return default_max_batch(engine)
    return _capped(override, engine.limits.max_batch_items)
