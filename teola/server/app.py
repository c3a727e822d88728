"""`create_app(apps, options)`: the FastAPI application of one server.

At startup (on the server's event loop) every app attaches a metrics hook to the
runtime it keeps for that loop: the runtime all requests of the app then share, so the
engine schedulers batch across requests. Each app gets its admission gate there too:
its bound on concurrent queries is `max_concurrency`, or what its engines can serve
(`App.capacity`, 64 when unknown); when every gate is full, requests are refused before
they are routed (`shedding`). At shutdown the runtimes are closed.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from teola.server.admission import Admission, Gate
from teola.server.apps import App
from teola.server.errors import APIError, handle_api_error
from teola.server.lag import LoopLag
from teola.server.metrics import ServerMetrics
from teola.server.options import ServeOptions
from teola.server.routes import ServerState, make_router
from teola.server.schemas import ErrorResponse
from teola.server.shedding import ShedWhenFull
from teola_core.runtime.timeouts import Timeouts

log = logging.getLogger("teola.server")

DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_CONCURRENCY = 64  # an app whose engines say nothing (only opaque steps)


def create_app(apps: Sequence[App], options: ServeOptions | None = None, **changes: Any) -> FastAPI:
    """A FastAPI app serving `apps` under their names (see `teola.server`).

    `options` (default `ServeOptions()`); keyword arguments change single fields, e.g.
    `create_app(apps, api_key="secret")`.
    """
    names = [a.name for a in apps]
    if len(set(names)) != len(names):
        raise ValueError(f"app names must be unique, got {names}")
    options = replace(options or ServeOptions(), **changes)
    gates: dict[str, Gate] = {}
    lag = LoopLag()
    metrics = ServerMetrics(apps, gates, lag)
    state = ServerState({a.name: a for a in apps}, gates, metrics, options)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        for app in apps:
            app.attach(metrics.hook(app.name))
            if options.step_timeout_s is not None and hasattr(app, "use_timeouts"):
                app.use_timeouts(Timeouts.of(options.step_timeout_s))
            gates[app.name] = gate_for(app, options)
        lag.start()
        try:
            yield
        finally:
            lag.stop()
            for app in apps:
                await app.close()

    api = FastAPI(title="Teola", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    api.state.teola = state
    api.include_router(make_router(state))
    api.add_middleware(
        ShedWhenFull,
        gates=gates,
        metrics=metrics,
        retry_after_s=options.retry_after_s,
        lag=lag,
        max_lag_s=options.max_lag_s,
    )
    api.add_exception_handler(APIError, handle_api_error)
    api.add_exception_handler(HTTPException, _http_error)
    api.add_exception_handler(Exception, _internal_error)
    return api


def gate_for(app: App, options: ServeOptions) -> Gate:
    """The app's admission gate: at most `max_concurrency` or its engines' capacity at once
    (fewer while admitting more only slows each query down); the queue as long."""
    capacity = getattr(app, "capacity", lambda: None)()
    limit = options.max_concurrency or capacity or DEFAULT_CONCURRENCY
    queue = "as many as run" if options.max_queue is None else str(options.max_queue)
    log.info(
        "app %r: at most %d queries at once, %s more may wait %g s", app.name, limit, queue, options.queue_timeout_s
    )
    return Gate(Admission(limit, options.max_queue), options.queue_timeout_s)


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
