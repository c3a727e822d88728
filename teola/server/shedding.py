"""Refusing cheaply: a completion request that arrives while every app's wait queue is full,
or while the server's event loop is far behind (`lag`: a backlog no queue sees), is
answered 503 + `Retry-After` at once, before its body is read or routed.

Under overload the server spends CPU on the requests it refuses too; if refusing cost as
much as parsing and routing a request, refusals would crowd out the answers. With one app
(or all of them full) the request's app cannot have room, whatever its body says; with
several apps and room in one, the request goes on to the routes, whose per-app gate decides.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from teola.server.admission import Gate
from teola.server.errors import overloaded
from teola.server.lag import LoopLag
from teola.server.metrics import ServerMetrics

COMPLETION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


@dataclass(eq=False)
class ShedWhenFull:
    """ASGI middleware (see the module docstring)."""

    app: ASGIApp
    gates: Mapping[str, Gate]
    metrics: ServerMetrics
    retry_after_s: int
    lag: LoopLag
    max_lag_s: float

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gates = self.gates
        if scope["type"] != "http" or scope["path"] not in COMPLETION_PATHS or not gates:
            await self.app(scope, receive, send)
            return
        behind = self.lag.behind()
        if behind > self.max_lag_s:  # a backlog no queue sees: it drains at the cost of a refusal
            reason, why = "server_busy", f"the server is {behind:.1f} s behind"
        elif all(g.full for g in gates.values()):
            reason, why = "queue_full", "every wait queue is full"
        else:
            await self.app(scope, receive, send)
            return
        model = next(iter(gates)) if len(gates) == 1 else ""
        self.metrics.shed.labels(model, reason).inc()
        self.metrics.requests.labels(model, scope["path"], "503").inc()
        error = overloaded(model or "every served model", why, self.retry_after_s)
        body = json.dumps(error.body()).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in (error.headers or {}).items()]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})
