"""`stream: true`: the app's chunks as server-sent events in OpenAI's chunk format.

The app's `astream` runs in one task of its own (`ChunkStream`) and hands chunks over a
bounded queue (backpressure: a slow client slows the producer). One task, because
LangChain's streaming sets and resets context variables that must stay in one context.
The route awaits the first chunk before answering, so a failure before any output is
a proper HTTP 500; a failure after it is sent as an SSE `{"error": ...}` event naming the
step that failed (the OpenAI clients raise it as `APIError`), and so is the request's
deadline passing. The stream ends with `data: [DONE]`.

Text chunks (strings, message chunks) go out as they come, cut at the first `stop`
string; an app whose chunks are not text (a dict from a JSON parser) is added up and
sent as one JSON chunk at the end. A client that disconnects mid-stream stops the
response; `SSEResponse` then closes the stream, which cancels the producer task and so
the query.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from teola.server.apps import App, AppFailed
from teola.server.errors import APIError, app_failure, past_deadline
from teola.server.responses import StopCutter, add_chunks, text_of, to_text, usage_of

Item = tuple[Literal["chunk", "error", "end"], Any]


class ChunkStream:
    """The app's `astream(value)` running in its own task, read with `next()`."""

    def __init__(self, app: App, value: Any, buffer: int = 64) -> None:
        self._app = app
        self._queue: asyncio.Queue[Item] = asyncio.Queue(maxsize=buffer)
        self._task = asyncio.get_running_loop().create_task(self._produce(value))

    async def _produce(self, value: Any) -> None:
        try:
            async for chunk in self._app.astream(value):
                await self._queue.put(("chunk", chunk))
        except Exception as exc:  # handed to the reader, who reports it to the client
            await self._queue.put(("error", exc))
        else:
            await self._queue.put(("end", None))

    async def next(self) -> Item:
        return await self._queue.get()

    async def aclose(self) -> None:
        """Cancel the producer (and so the query) if it still runs; wait for it to unwind."""
        if not self._task.done():
            self._task.cancel()
        await asyncio.wait({self._task})


def failure(model: str, error: BaseException) -> APIError:
    """The API error of an app failure (naming the step the app says failed)."""
    if isinstance(error, AppFailed):
        return app_failure(model, error.error, error.step)
    return app_failure(model, error)


class SSEResponse(StreamingResponse):
    """A streaming response that runs `on_close` however it ends (done, failed, client gone)."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()


def sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


@dataclass(frozen=True)
class StreamReply:
    """What the SSE body needs to know about its request."""

    kind: Literal["chat", "completion"]
    model: str
    response_id: str
    created: int
    prompt: str
    include_usage: bool
    stops: list[str]
    echo: bool
    deadline: float  # loop time
    timeout_s: float

    def chunk(self, text: str | None, finish: str | None = None, role: bool = False) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
            obj = "text_completion"
        return {
            "id": self.response_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }


async def events(
    first: Item, stream: ChunkStream, reply: StreamReply, on_end: Callable[[str], None]
) -> AsyncIterator[str]:
    """The SSE body: a role chunk (chat), content chunks, a finish chunk, usage, [DONE].

    `on_end(status)` reports how the stream ended: "200", "500" (the app failed), "504"
    (past the request deadline) or "499" (the client left: the generator was closed).
    """
    status = "499"
    cutter = StopCutter(reply.stops)
    try:
        if reply.kind == "chat":
            yield sse(reply.chunk(None, role=True))
        if reply.echo and reply.prompt:
            yield sse(reply.chunk(reply.prompt))
        final: Any = None
        started = False
        texts: list[str] = []
        as_text: bool | None = None
        item = first
        while item[0] == "chunk" and not cutter.stopped:
            value = item[1]
            final = add_chunks(final, value, started)
            started = True
            text = text_of(value)
            if as_text is None:
                as_text = text is not None
            if as_text:
                piece = cutter.feed(text if text is not None else to_text(value))
                texts.append(piece)
                if piece:
                    yield sse(reply.chunk(piece))
            try:
                async with asyncio.timeout_at(reply.deadline):
                    item = await stream.next()
            except TimeoutError:
                status = "504"
                yield sse(past_deadline(reply.model, reply.timeout_s).body())
                return
        if item[0] == "error":
            status = "500"
            yield sse(failure(reply.model, item[1]).body())
            return
        rest = cutter.close() if as_text else ""
        if rest:
            texts.append(rest)
            yield sse(reply.chunk(rest))
        if started and not as_text:
            texts.append(cutter.feed(to_text(final)) + cutter.close())
            yield sse(reply.chunk(texts[-1]))
        yield sse(reply.chunk(None, finish="stop"))
        if reply.include_usage:
            usage = usage_of(final, reply.prompt, "".join(texts)).model_dump()
            yield sse({**reply.chunk(None), "choices": [], "usage": usage})
        yield "data: [DONE]\n\n"
        status = "200"
    finally:
        on_end(status)
