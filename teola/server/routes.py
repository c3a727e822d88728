"""The endpoints: /v1/models, /v1/chat/completions, /v1/completions, /health, /metrics.

Order of checks for a completion request: API key (401), body size (413), body
(400 naming the field: invalid JSON, wrong types, unknown fields), model (404), the
app's input (400 naming the field and the app's variable), the app's run (500 naming
the primitive or step that failed). /health and /metrics need no key.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from uuid import uuid4

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ValidationError

from teola.server.apps import App
from teola.server.calls import ClientGone, until_disconnect
from teola.server.errors import APIError, app_failure, from_validation
from teola.server.inputs import chat_text, prompt_text, to_app_input
from teola.server.metrics import ServerMetrics
from teola.server.responses import to_text, usage_of
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
from teola.server.streaming import ChunkStream, SSEResponse, events

R = TypeVar("R", bound=BaseModel)

CLIENT_GONE = 499  # nginx's "client closed request": nothing is sent, it is for the metrics


@dataclass
class ServerState:
    """What the routes of one server share (passed explicitly; no globals)."""

    apps: dict[str, App]
    metrics: ServerMetrics
    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    created: int = field(default_factory=lambda: int(time.time()))


def make_router(state: ServerState) -> APIRouter:
    router = APIRouter()

    def require_key(request: Request) -> None:
        if state.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if not header or scheme.lower() != "bearer" or not token:
            raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'", "authentication_error")
        if not hmac.compare_digest(token.strip().encode(), state.api_key.encode()):
            raise APIError(401, "invalid API key", "authentication_error", code="invalid_api_key")

    @router.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "models": sorted(state.apps)}

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=state.metrics.content_type)

    @router.get("/v1/models", dependencies=[Depends(require_key)])
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=name, created=state.created) for name in state.apps])

    @router.get("/v1/models/{model}", dependencies=[Depends(require_key)])
    async def model_card(model: str) -> ModelCard:
        lookup(model)
        return ModelCard(id=model, created=state.created)

    @router.post("/v1/chat/completions", dependencies=[Depends(require_key)])
    async def chat_completions(request: Request) -> Response:
        body = await read_body(request, ChatCompletionRequest)
        app = lookup(body.model)
        text, param = chat_text(body.messages)
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return await complete(request, app, "chat", text, param, body.stream, include_usage)

    @router.post("/v1/completions", dependencies=[Depends(require_key)])
    async def completions(request: Request) -> Response:
        body = await read_body(request, CompletionRequest)
        app = lookup(body.model)
        text, param = prompt_text(body.prompt)
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return await complete(request, app, "completion", text, param, body.stream, include_usage)

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
        limit = state.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise too_large(limit)
        raw = bytearray()
        async for part in request.stream():
            raw += part
            if len(raw) > limit:
                raise too_large(limit)
        try:
            return model.model_validate_json(bytes(raw))
        except ValidationError as exc:
            raise from_validation(exc) from exc

    async def complete(
        request: Request,
        app: App,
        kind: Literal["chat", "completion"],
        text: str,
        param: str,
        stream: bool,
        include_usage: bool,
    ) -> Response:
        value = to_app_input(app.input_schema(), text, param, app.name)
        endpoint = request.url.path
        done = track(app.name, endpoint)
        response_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid4().hex}"
        created = int(time.time())
        if stream:
            chunks = ChunkStream(app, value)
            try:
                first = await until_disconnect(request, chunks.next())
            except ClientGone:
                await chunks.aclose()
                done(str(CLIENT_GONE))
                return Response(status_code=CLIENT_GONE)
            except BaseException:
                await chunks.aclose()
                done("500")
                raise
            if first[0] == "error":
                await chunks.aclose()
                done("500")
                raise app_failure(app.name, first[1]) from first[1]
            body = events(
                first,
                chunks,
                kind=kind,
                model=app.name,
                response_id=response_id,
                created=created,
                prompt=text,
                include_usage=include_usage,
                on_end=done,
            )
            return SSEResponse(body, on_close=chunks.aclose)
        try:
            output = await until_disconnect(request, app.ainvoke(value))
        except ClientGone:
            done(str(CLIENT_GONE))
            return Response(status_code=CLIENT_GONE)
        except Exception as exc:
            done("500")
            raise app_failure(app.name, exc) from exc
        answer = to_text(output)
        usage = usage_of(output, text, answer)
        done("200")
        if kind == "chat":
            chat = ChatCompletion(
                id=response_id,
                created=created,
                model=app.name,
                choices=[ChatChoice(message=AssistantMessage(content=answer))],
                usage=usage,
            )
            return Response(chat.model_dump_json(), media_type="application/json")
        completion = Completion(
            id=response_id, created=created, model=app.name, choices=[CompletionChoice(text=answer)], usage=usage
        )
        return Response(completion.model_dump_json(), media_type="application/json")

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


def too_large(limit: int) -> APIError:
    return APIError(413, f"request body larger than {limit} bytes", "invalid_request_error", code="body_too_large")
