"""Running one query for a request, cancelled when its client goes away.

A request's query runs in its own task, raced against the client's `http.disconnect`
(the ASGI `receive` channel: an event, not a poll). If the client leaves first, the
query task is cancelled, which cancels the query in the runtime (its pending nodes leave
the engine queues; batches only it needed are cancelled) and the other requests go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its answer was ready; its query was cancelled."""


async def wait_disconnect(request: Request) -> None:
    """Return when the client disconnects (the body has already been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass  # a late body message of an already-read request: keep listening


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """`await work`, unless the client disconnects first: then cancel it, raise ClientGone."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(wait_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})  # let the query unwind before the request ends
    if task.cancelled() and watch.done() and not watch.cancelled():
        raise ClientGone()
    return task.result()
