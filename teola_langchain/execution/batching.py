"""`RunnableSequence.batch` semantics for steps whose own `batch` is not one `invoke` per input.

LangChain batches a sequence stage by stage: step k's `batch` gets every input that has
not failed yet, at once. For a step whose `batch` is `Runnable`'s own, that is one
`invoke` per input, so Teola runs each input as its own query and lets them pipeline.
A step with its own `batch` (a `BaseLLM`, `FakeListChatModel`, a retry, a user's class)
may compute something else from the whole list, so its inputs meet at a barrier and its
`batch` runs once, as in LangChain:

    group = BatchGroup(size=4, return_exceptions=True)
    await group.join(step=2, index=0, value=..., config=..., run_batch=...)  # every live input joins

A query that fails before a barrier leaves the group (`leave`), so the barrier waits only
for the inputs LangChain would still pass to that step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from langchain_core.runnables import RunnableConfig

RunBatch = Callable[[list[Any], list[RunnableConfig]], Awaitable[list[Any]]]


@dataclass
class _Barrier:
    arrived: dict[int, tuple[Any, RunnableConfig, asyncio.Future[Any]]] = field(default_factory=dict)
    run_batch: RunBatch | None = None


class BatchGroup:
    """The queries of one `batch()` call over a sequence (see the module docstring)."""

    def __init__(self, size: int, return_exceptions: bool) -> None:
        self.size = size
        self.return_exceptions = return_exceptions
        self._live = set(range(size))
        self._barriers: dict[int, _Barrier] = {}

    async def join(self, step: int, index: int, value: Any, config: RunnableConfig, run_batch: RunBatch) -> Any:
        """Wait for every live input at `step`, run its batch once, return this input's result."""
        barrier = self._barriers.setdefault(step, _Barrier())
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        barrier.arrived[index] = (value, config, future)
        barrier.run_batch = run_batch
        self._release(step)
        return await future

    def leave(self, index: int) -> None:
        """Input `index` failed or was cancelled: no barrier waits for it any more."""
        self._live.discard(index)
        for step in list(self._barriers):
            self._release(step)

    def _release(self, step: int) -> None:
        barrier = self._barriers[step]
        waiting = self._live - set(barrier.arrived)
        if waiting or barrier.run_batch is None or not barrier.arrived:
            return
        del self._barriers[step]
        order = sorted(barrier.arrived)
        values = [barrier.arrived[i][0] for i in order]
        configs = [barrier.arrived[i][1] for i in order]
        futures = [barrier.arrived[i][2] for i in order]
        asyncio.get_running_loop().create_task(_run(barrier.run_batch, values, configs, futures))


async def _run(run_batch: RunBatch, values: list[Any], configs: list[RunnableConfig], futures: list[Any]) -> None:
    try:
        results = await run_batch(values, configs)
    except BaseException as exc:  # the step's batch raised: every input of it fails with that error
        for future in futures:
            if not future.done():
                future.set_exception(exc)
        return
    for future, result in zip(futures, results, strict=True):
        if future.done():
            continue
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)
