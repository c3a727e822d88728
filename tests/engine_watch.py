"""Events for tests: an engine scheduler of a `LocalRuntime` announces that a condition holds.

The engine scheduler is a pure state machine: the runtime hands it every engine event
(`NodeReady`, `BatchFinished`, ...) through `handle`. Wrapping that method lets a test
wait for "two calls are queued" or "a batch has started" on an `asyncio.Event`, checked
after every event the scheduler handles: no polling, no counting of loop turns.

    two_queued = queued(runtime, "emb", 2)       # before the calls are made
    b, c = start(b_query), start(c_query)
    await two_queued.wait()                      # both wait in the engine's queue now

`hold_batches` makes an engine's first batch last until a given number of calls have
reached it: where a fake engine would sleep "so that the others queue meanwhile".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from teola_core.runtime.local import LocalRuntime
from teola_core.scheduler.engine_scheduler import EngineScheduler


def watch(runtime: Any, engine: str, condition: Callable[[EngineScheduler], bool]) -> asyncio.Event:
    """An event set as soon as `condition(scheduler)` holds for `engine`'s scheduler on
    `runtime` (checked now and after each `handle`; once set, it stays set)."""
    if not isinstance(runtime, LocalRuntime):
        raise TypeError(f"watch needs a LocalRuntime, got {type(runtime).__name__}")
    scheduler = runtime.scheduler(engine)
    reached = asyncio.Event()
    handle = scheduler.handle

    def handle_and_check(*events: Any) -> Any:
        actions = handle(*events)
        if condition(scheduler):
            reached.set()
        return actions

    scheduler.handle = handle_and_check  # type: ignore[method-assign]
    if condition(scheduler):
        reached.set()
    return reached


def queued(runtime: Any, engine: str, calls: int) -> asyncio.Event:
    """Set once at least `calls` calls wait in `engine`'s queue (pending, not started)."""
    return watch(runtime, engine, lambda s: s.pending >= calls)


def running(runtime: Any, engine: str, batches: int = 1) -> asyncio.Event:
    """Set once at least `batches` batches of `engine` are in flight at the same time."""
    return watch(runtime, engine, lambda s: len(s.running) >= batches)


def hold_batches(runtime: Any, engine: Any, calls: int) -> None:
    """Hold each batch of `engine` (an engine object of `runtime`) until `calls` of its calls
    are queued or running: the first batch then lasts until the other callers' calls wait
    behind it, which a fake engine that sleeps would only make likely."""
    every_call_in = watch(runtime, engine.name, lambda s: s.pending + sum(len(b.calls) for b in s.running) >= calls)
    run = engine.run

    async def run_when_every_call_is_in(batch: Any) -> Any:
        await every_call_in.wait()
        return await run(batch)

    engine.run = run_when_every_call_is_in
