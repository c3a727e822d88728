"""The endpoints: /v1/models, /v1/chat/completions, /v1/completions, /health, /metrics.

Order of checks for a completion request: API key (401), Content-Type (415 unless JSON),
body size (413), body (400 naming the field: invalid JSON, wrong types, unknown or
unsupported fields), model (404), the app's input (400 naming the field and the app's
variable), admission (503 + Retry-After when the app is overloaded), the app's run (500
naming the step that failed). The whole request runs within `request_timeout_s` (504).
A client that disconnects, whenever it does (body, queue, run, stream), ends its work:
it is counted in /metrics and logged at debug level, once. /health needs no key; /metrics
needs it unless `public_metrics`. When every app's queue is full, or the server is far
behind, a completion request is refused (503) before any of this (`shedding`).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from uuid import uuid4

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from teola.server.admission import Gate, Overloaded
from teola.server.apps import App
from teola.server.calls import ClientGone, ClientWatch, Phase
from teola.server.errors import APIError, from_validation, overloaded, past_deadline, unsupported_media
from teola.server.inputs import chat_text, prompt_text, to_app_input
from teola.server.metrics import ServerMetrics
from teola.server.options import ServeOptions
from teola.server.responses import cut_at_stop, to_text, usage_of
from teola.server.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionChoice,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from teola.server.streaming import ChunkStream, SSEResponse, StreamReply, events, failure

R = TypeVar("R", bound=BaseModel)
log = logging.getLogger("teola.server")

CLIENT_GONE = 499  # nginx's "client closed request": nothing is sent, it is for the metrics


@dataclass
class ServerState:
    """What the routes of one server share (passed explicitly; no globals)."""

    apps: dict[str, App]
    gates: dict[str, Gate]
    metrics: ServerMetrics
    options: ServeOptions = field(default_factory=ServeOptions)
    created: int = field(default_factory=lambda: int(time.time()))


def make_router(state: ServerState) -> APIRouter:
    router = APIRouter()
    options = state.options

    async def require_key(request: Request) -> None:  # async: FastAPI runs a plain def in a thread pool
        if options.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if not header or scheme.lower() != "bearer" or not token:
            raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'", "authentication_error")
        if not hmac.compare_digest(token.strip().encode(), options.api_key.encode()):
            raise APIError(401, "invalid API key", "authentication_error", code="invalid_api_key")

    async def require_json(request: Request) -> None:
        """A JSON body only: a browser page cannot send one cross-site without a preflight."""
        content_type = request.headers.get("content-type", "")
        if content_type.split(";", 1)[0].strip().lower() != "application/json":
            raise unsupported_media(content_type)

    metrics_guard = [] if options.public_metrics else [Depends(require_key)]
    completion_guards = [Depends(require_key), Depends(require_json)]

    @router.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok"}

    @router.get("/metrics", dependencies=metrics_guard)
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=state.metrics.content_type)

    @router.get("/v1/models", dependencies=[Depends(require_key)])
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=name, created=state.created) for name in state.apps])

    @router.get("/v1/models/{model}", dependencies=[Depends(require_key)])
    async def model_card(model: str) -> ModelCard:
        lookup(model)
        return ModelCard(id=model, created=state.created)

    @router.post("/v1/chat/completions", dependencies=completion_guards)
    async def chat_completions(request: Request) -> Response:
        return await handle(request, "chat")

    @router.post("/v1/completions", dependencies=completion_guards)
    async def completions(request: Request) -> Response:
        return await handle(request, "completion")

    def lookup(model: str) -> App:
        app = state.apps.get(model)
        if app is None:
            known = ", ".join(sorted(state.apps)) or "none"
            raise APIError(
                404,
                f"model {model!r} does not exist (served: {known})",
                "invalid_request_error",
                "model",
                "model_not_found",
            )
        return app

    async def read_body(request: Request, model: type[R]) -> R:
        """The body parsed into `model`, read up to the size limit (413 past it)."""
        limit = options.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise too_large(limit)
        raw = bytearray()
        try:
            async for part in request.stream():
                raw += part
                if len(raw) > limit:
                    raise too_large(limit)
        except ClientDisconnect:
            raise ClientGone("body") from None
        try:
            return model.model_validate_json(bytes(raw))
        except ValidationError as exc:
            raise from_validation(exc) from exc

    def gone(model: str, endpoint: str, phase: Phase) -> None:
        state.metrics.disconnects.labels(model, phase).inc()
        log.debug("client left %s (%s) while %s; its work was cancelled", endpoint, model or "model unknown", phase)

    async def handle(request: Request, kind: Literal["chat", "completion"]) -> Response:
        deadline = asyncio.get_running_loop().time() + options.request_timeout_s
        endpoint = request.url.path
        try:
            async with asyncio.timeout_at(deadline):
                body: ChatCompletionRequest | CompletionRequest = await read_body(
                    request, ChatCompletionRequest if kind == "chat" else CompletionRequest
                )
        except ClientGone as left:
            gone("", endpoint, left.phase)
            return Response(status_code=CLIENT_GONE)
        except TimeoutError:
            raise APIError(408, "the request body did not arrive in time", "invalid_request_error") from None
        app = lookup(body.model)
        if isinstance(body, ChatCompletionRequest):
            text, param = chat_text(body.messages)
        else:
            text, param = prompt_text(body.prompt)
        value = to_app_input(app.input_schema(), text, param, app.name)
        return await run(request, Query(app, kind, body, text, value, deadline))

    async def run(request: Request, q: Query) -> Response:
        app = q.app
        endpoint = request.url.path
        done = track(app.name, endpoint)
        gate = state.gates[app.name]
        ticket = gate.ticket()
        watch = ClientWatch(request)
        streaming = False
        phase: Phase = "queued"
        scope = asyncio.timeout_at(q.deadline)
        try:
            async with scope:
                await watch.race(gate.enter(ticket), "queued")
                phase = "running"
                if q.body.stream:
                    end = StreamEnd(lambda phase: gone(app.name, endpoint, phase), done)
                    response = await start_stream(q, watch, ticket, end)
                    streaming = True
                    return response
                output = await watch.race(app.ainvoke(q.value), "running")
        except Overloaded as exc:
            state.metrics.shed.labels(app.name, exc.reason).inc()
            log.debug("shed a request to %s (%s): %s", app.name, exc.reason, exc)
            done("503")
            raise overloaded(app.name, str(exc), options.retry_after_s) from None
        except ClientGone as left:
            gone(app.name, endpoint, left.phase)
            done(str(CLIENT_GONE))
            return Response(status_code=CLIENT_GONE)
        except TimeoutError as exc:
            if not scope.expired():
                raise
            log.debug("%s (%s) ran past its deadline while %s", endpoint, app.name, phase)
            done("504")
            raise past_deadline(app.name, options.request_timeout_s) from exc
        except Exception as exc:
            done("500")
            raise failure(app.name, exc) from exc
        finally:
            if not streaming:  # else the stream gives them back when it ends
                gate.leave(ticket)
                watch.close()
        done("200")
        return answer(q, output)

    async def start_stream(q: Query, watch: ClientWatch, ticket: int, end: StreamEnd) -> Response:
        """Await the app's first chunk (a failure before it is a plain HTTP error), then stream."""
        app, body = q.app, q.body
        chunks = ChunkStream(app, q.value)
        try:
            first = await watch.race(chunks.next(), "running")
        except BaseException:
            await chunks.aclose()
            raise
        if first[0] == "error":
            await chunks.aclose()
            raise first[1]

        async def close() -> None:
            end(str(CLIENT_GONE))  # unless the body already said how it ended
            await chunks.aclose()
            state.gates[app.name].leave(ticket)
            watch.close()

        reply = StreamReply(
            kind=q.kind,
            model=app.name,
            response_id=response_id(q.kind),
            created=int(time.time()),
            prompt=q.text,
            include_usage=body.stream_options is not None and body.stream_options.include_usage,
            stops=body.stops(),
            echo=isinstance(body, CompletionRequest) and bool(body.echo),
            deadline=q.deadline,
            timeout_s=options.request_timeout_s,
        )
        return SSEResponse(events(first, chunks, reply, end), on_close=close)

    def track(model: str, endpoint: str) -> Callable[[str], None]:
        """Start a request's metrics; the returned function ends them with a status (once)."""
        m = state.metrics
        m.in_progress.labels(model).inc()
        start = time.perf_counter()
        ended = False

        def done(status: str) -> None:
            nonlocal ended
            if ended:
                return
            ended = True
            m.in_progress.labels(model).dec()
            m.request_latency.labels(model, endpoint).observe(time.perf_counter() - start)
            m.requests.labels(model, endpoint, status).inc()

        return done

    return router


class StreamEnd:
    """How a stream ended, told once: the request's metrics, and a disconnect if the client left."""

    def __init__(self, gone: Callable[[Phase], None], done: Callable[[str], None]) -> None:
        self._gone = gone
        self._done = done
        self.status: str | None = None

    def __call__(self, status: str) -> None:
        if self.status is not None:
            return
        self.status = status
        if status == str(CLIENT_GONE):
            self._gone("streaming")
        self._done(status)


def response_id(kind: Literal["chat", "completion"]) -> str:
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid4().hex}"


@dataclass(frozen=True)
class Query:
    """One completion request, parsed: its app, its kind, its body, its text and the app's input."""

    app: App
    kind: Literal["chat", "completion"]
    body: ChatCompletionRequest | CompletionRequest
    text: str
    value: Any
    deadline: float  # loop time


def answer(q: Query, output: Any) -> Response:
    """The JSON response of a finished query: its text cut at `stop`, echo honoured."""
    kind, model, body, text = q.kind, q.app.name, q.body, q.text
    content, _ = cut_at_stop(to_text(output), body.stops())
    usage = usage_of(output, text, content)
    if kind == "chat":
        chat = ChatCompletion(
            id=response_id(kind),
            created=int(time.time()),
            model=model,
            choices=[ChatChoice(message=AssistantMessage(content=content))],
            usage=usage,
        )
        return Response(chat.model_dump_json(), media_type="application/json")
    if isinstance(body, CompletionRequest) and body.echo:
        content = text + content
    completion = Completion(
        id=response_id(kind),
        created=int(time.time()),
        model=model,
        choices=[CompletionChoice(text=content)],
        usage=usage,
    )
    return Response(completion.model_dump_json(), media_type="application/json")


def too_large(limit: int) -> APIError:
    return APIError(413, f"request body larger than {limit} bytes", "invalid_request_error", code="body_too_large")
