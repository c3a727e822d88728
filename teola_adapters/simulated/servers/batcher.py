"""One engine instance serving HTTP requests in batches, as an embedding or rerank server does.

    batches = Batcher(run_batch, "dynamic", max_items=16)
    vectors = await batches.submit(texts, len(texts))

"request": each request is its own batch and requests queue for the instance (a plain
model behind HTTP). "dynamic": requests waiting when the instance frees up form its
next batch, up to `max_items` items, with no wait window, so a lone request never waits
for company (TEI-style dynamic batching); a request larger than the cap is one batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

Batching = Literal["request", "dynamic"]
BATCHING_MODES: tuple[str, ...] = ("request", "dynamic")

T = TypeVar("T")
R = TypeVar("R")


@dataclass(eq=False)
class _Pending(Generic[T, R]):
    payload: T
    items: int
    future: asyncio.Future[R]


@dataclass(eq=False)
class Batcher(Generic[T, R]):
    """`run(payloads) -> results` does one batch (it spends the engine's time)."""

    run: Callable[[list[T]], Awaitable[list[R]]]
    mode: Batching
    max_items: int = 64
    _queue: asyncio.Queue[_Pending[T, R]] | None = None
    _worker: asyncio.Task[None] | None = None
    _gate: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def submit(self, payload: T, items: int) -> R:
        if self.mode == "request":
            async with self._gate:  # one instance: requests queue for it
                return (await self.run([payload]))[0]
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._worker = asyncio.get_running_loop().create_task(self._serve(self._queue))
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(payload, items, future))
        return await future

    async def _serve(self, queue: asyncio.Queue[_Pending[T, R]]) -> None:
        carry: _Pending[T, R] | None = None
        while True:
            first = carry if carry is not None else await queue.get()
            carry = None
            batch, total = [first], first.items
            while not queue.empty():
                nxt = queue.get_nowait()
                if total + nxt.items > self.max_items:
                    carry = nxt
                    break
                batch.append(nxt)
                total += nxt.items
            live = [p for p in batch if not p.future.done()]
            if not live:
                continue
            try:
                results = await self.run([p.payload for p in live])
            except Exception as exc:  # the batch failed: every request in it fails with it
                for p in live:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            for p, r in zip(live, results, strict=True):
                if not p.future.done():
                    p.future.set_result(r)

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
