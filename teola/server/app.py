"""`create_app(apps)`: the FastAPI application of one server.

At startup (on the server's event loop) every app attaches a metrics hook to the
runtime it keeps for that loop: the runtime all requests of the app then share, so the
engine schedulers batch across requests. At shutdown the runtimes are closed.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from teola.server.apps import App
from teola.server.errors import APIError, handle_api_error
from teola.server.metrics import ServerMetrics
from teola.server.routes import ServerState, make_router
from teola.server.schemas import ErrorResponse

log = logging.getLogger("teola.server")

DEFAULT_MAX_BODY_BYTES = 1 << 20


def create_app(
    apps: Sequence[App], *, api_key: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
) -> FastAPI:
    """A FastAPI app serving `apps` under their names (see `teola.server`)."""
    names = [a.name for a in apps]
    if len(set(names)) != len(names):
        raise ValueError(f"app names must be unique, got {names}")
    metrics = ServerMetrics(apps)
    state = ServerState({a.name: a for a in apps}, metrics, api_key, max_body_bytes)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        for app in apps:
            app.attach(metrics.hook(app.name))
        try:
            yield
        finally:
            for app in apps:
                await app.close()

    api = FastAPI(title="Teola", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    api.state.teola = state
    api.include_router(make_router(state))
    api.add_exception_handler(APIError, handle_api_error)
    api.add_exception_handler(HTTPException, _http_error)
    api.add_exception_handler(Exception, _internal_error)
    return api


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own errors (unknown route 404, wrong method 405) in OpenAI's format."""
    if not isinstance(exc, HTTPException):
        raise exc
    body = ErrorResponse.of(f"{request.method} {request.url.path}: {exc.detail}", "invalid_request_error")
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    """A bug in the server itself: logged with its traceback, reported as a 500."""
    log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    body = ErrorResponse.of(f"internal server error: {type(exc).__name__}: {exc}", "server_error")
    return JSONResponse(body, status_code=500)
