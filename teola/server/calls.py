"""Running one request's work, cancelled when its client goes away.

After the body is read, one task per request listens on the ASGI `receive` channel for
`http.disconnect` (an event, not a poll). Work raced against it (the wait for an
admission slot, the query) is cancelled if the client leaves first, which cancels the
query in the runtime (its pending nodes leave the engine queues; batches only it needed
are cancelled) while the other requests go on. A disconnect while the body is still being
read ends the request the same way (`ClientGone("body")`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Literal, TypeVar

from starlette.requests import Request

T = TypeVar("T")
Phase = Literal["body", "queued", "running", "streaming"]


class ClientGone(Exception):
    """The client disconnected before its answer was complete; its work was cancelled."""

    def __init__(self, phase: Phase) -> None:
        super().__init__(f"client disconnected ({phase})")
        self.phase = phase


class ClientWatch:
    """`gone` is set when the request's client disconnects (the body has been read)."""

    def __init__(self, request: Request) -> None:
        self.gone = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._watch(request))

    async def _watch(self, request: Request) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass  # a late body message of an already-read request: keep listening
        self.gone.set()

    async def race(self, work: Awaitable[T], phase: Phase) -> T:
        """`await work`, unless the client disconnects first: then cancel it, raise ClientGone."""
        task = asyncio.ensure_future(work)
        gone = asyncio.ensure_future(self.gone.wait())
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not task.done():
                task.cancel()
                await asyncio.wait({task})  # let the work unwind before the request ends
        if task.cancelled() and self.gone.is_set():
            raise ClientGone(phase)
        return task.result()

    def close(self) -> None:
        self._task.cancel()
