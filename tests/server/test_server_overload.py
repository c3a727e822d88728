"""Overload, deadlines and disconnects against a real server on loopback.

Each test starts its own server with the limits it needs. The tests synchronise on
events, never on sleeps: the gated model releases a semaphore when a call reaches it,
the server's admission machine is spied on to know a request is queued, and the
server's own debug log line (one per disconnect or shed) is the signal that it noticed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from server_fakes import build_guarded_apps
from server_support import API_KEY, AUTH

from teola.server import BackgroundServer, ServeOptions, create_app, wrap_app
from teola.server.admission import Gate

HEADERS = {**AUTH, "Content-Type": "application/json"}
WAIT = 30.0  # a bound on event waits, so a broken server fails the test instead of hanging it


def chat(model: str, text: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], **fields}


class Signals(logging.Handler):
    """Every log record while installed; `wait(pattern)` blocks until one matches."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self._changed:
            self.records.append(record)
            self._changed.notify_all()

    def matching(self, pattern: str) -> list[logging.LogRecord]:
        return [r for r in self.records if re.search(pattern, r.getMessage())]

    def wait(self, pattern: str, count: int = 1) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.matching(pattern)) >= count, WAIT), pattern


@dataclass
class Guarded:
    url: str
    gate: threading.Event
    entered: threading.Semaphore
    calls: list[str]
    started: threading.Event
    cancelled: threading.Event
    gates: dict[str, Gate]
    signals: Signals

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"{self.url}/metrics", headers=AUTH).text
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        match = re.search(rf"^{name}\{{{re.escape(wanted)}\}} ([0-9.e+-]+)$", text, re.M)
        return float(match.group(1)) if match else 0.0

    def in_model(self, n: int) -> None:
        """Wait until `n` more calls reached the gated model."""
        for _ in range(n):
            assert self.entered.acquire(timeout=WAIT)

    def queued_signal(self, app: str) -> threading.Event:
        """Set when a request to `app` is queued for a slot (the admission machine said so)."""
        queued = threading.Event()
        admission = self.gates[app].admission
        arrive = admission.arrive

        def spying(ticket: int) -> Any:
            actions = arrive(ticket)
            if not actions:
                queued.set()
            return actions

        admission.arrive = spying  # type: ignore[method-assign]
        return queued


@contextmanager
def guarded_server(**options: Any) -> Iterator[Guarded]:
    built = build_guarded_apps()
    apps = [wrap_app(name, app) for name, app in built["apps"].items()]
    api = create_app(apps, ServeOptions(api_key=API_KEY, **options))
    signals = Signals()
    loggers = [logging.getLogger(n) for n in ("", "uvicorn", "uvicorn.access")]  # the roots records reach
    server_log = logging.getLogger("teola.server")
    level = server_log.level
    server_log.setLevel(logging.DEBUG)
    for logger in loggers:
        logger.addHandler(signals)
    server = BackgroundServer(api)
    try:
        url = server.start()
        yield Guarded(
            url,
            built["gate"],
            built["entered"],
            built["calls"],
            built["started"],
            built["cancelled"],
            api.state.teola.gates,
            signals,
        )
    finally:
        built["gate"].set()  # let blocked model threads finish
        server.stop()
        for logger in loggers:
            logger.removeHandler(signals)
        server_log.setLevel(level)


def raw_request(url: str, body: dict[str, Any], *, send_bytes: int | None = None) -> socket.socket:
    """A request sent over a plain socket (all of it, or only `send_bytes` of the body)."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(head + data[: len(data) if send_bytes is None else send_bytes])
    return sock


def noise(signals: Signals) -> list[str]:
    """Warnings and errors logged (tracebacks of disconnects would show here)."""
    return [r.getMessage() for r in signals.records if r.levelno >= logging.WARNING]


# -- shedding ------------------------------------------------------------------------------
def test_a_full_queue_is_shed_with_503_and_retry_after_and_the_queued_request_is_served() -> None:
    with guarded_server(max_concurrency=2, max_queue=1, queue_timeout_s=WAIT) as s:

        async def main() -> None:
            async with httpx.AsyncClient(base_url=s.url, headers=HEADERS, timeout=WAIT) as client:
                running = [
                    asyncio.create_task(client.post("/v1/chat/completions", json=chat("gated", f"r{i}")))
                    for i in range(2)
                ]
                await asyncio.to_thread(s.in_model, 2)
                late = [
                    asyncio.create_task(client.post("/v1/chat/completions", json=chat("gated", f"l{i}")))
                    for i in range(2)
                ]
                done, waiting = await asyncio.wait(late, return_when=asyncio.FIRST_COMPLETED)
                (shed,) = done  # one found the queue full at once; the other waits in it
                response = shed.result()
                assert response.status_code == 503, response.text
                assert response.headers["retry-after"] == "1" and response.headers["retry-after-ms"] == "1000"
                error = response.json()["error"]
                assert error["code"] == "overloaded" and "'gated' is overloaded" in error["message"]
                s.gate.set()
                answers = await asyncio.gather(*running, *waiting)
                assert [a.status_code for a in answers] == [200, 200, 200]

        asyncio.run(main())
        assert s.metric("teola_requests_shed_total", model="gated", reason="queue_full") == 1
        assert s.metric("teola_admission_running", model="gated") == 0
        assert len(s.calls) == 3 and noise(s.signals) == []


def test_the_openai_client_retries_a_shed_request_and_gets_its_answer() -> None:
    with guarded_server(max_concurrency=1, max_queue=0) as s:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key=API_KEY, max_retries=2, timeout=WAIT)
        holder = threading.Thread(
            target=lambda: client.chat.completions.create(model="gated", messages=chat("gated", "first")["messages"])
        )
        holder.start()
        s.in_model(1)
        # Open the gate once the server has shed the second request: the client waits
        # Retry-After (1 s) and retries; by then the slot is free.
        opener = threading.Thread(target=lambda: (s.signals.wait("shed a request to gated"), s.gate.set()))
        opener.start()
        second = client.chat.completions.create(model="gated", messages=chat("gated", "second")["messages"])
        assert second.choices[0].message.content
        holder.join(WAIT)
        opener.join(WAIT)
        assert s.metric("teola_requests_shed_total", model="gated", reason="queue_full") >= 1
        assert s.calls == ["Answer briefly: first", "Answer briefly: second"]


def test_a_request_waiting_past_the_queue_timeout_is_shed() -> None:
    with guarded_server(max_concurrency=1, max_queue=4, queue_timeout_s=0.2) as s:
        with httpx.Client(base_url=s.url, headers=HEADERS, timeout=WAIT) as client:
            holder = threading.Thread(target=lambda: client.post("/v1/chat/completions", json=chat("gated", "hold")))
            holder.start()
            s.in_model(1)
            response = client.post("/v1/chat/completions", json=chat("gated", "waits"))
            assert response.status_code == 503 and "waited too long" in response.json()["error"]["message"]
            s.gate.set()
            holder.join(WAIT)
        assert s.metric("teola_requests_shed_total", model="gated", reason="queue_timeout") == 1
        assert s.calls == ["Answer briefly: hold"]


# -- deadlines -----------------------------------------------------------------------------
def test_a_request_past_its_deadline_is_a_504_and_its_query_is_cancelled() -> None:
    with guarded_server(request_timeout_s=0.5) as s:
        with pytest.raises(openai.APIStatusError) as info:
            openai.OpenAI(base_url=f"{s.url}/v1", api_key=API_KEY, max_retries=0, timeout=WAIT).chat.completions.create(
                model="blocking", messages=chat("blocking", "wait")["messages"]
            )
        assert info.value.status_code == 504
        assert "request timeout (0.5 s)" in info.value.message and "--request-timeout" in info.value.message
        assert s.cancelled.wait(WAIT)
        assert s.metric("teola_requests_total", endpoint="/v1/chat/completions", model="blocking", status="504") == 1
        assert s.metric("teola_admission_running", model="blocking") == 0


def test_a_hung_step_fails_its_request_naming_the_step_and_the_others_are_answered() -> None:
    with guarded_server(step_timeout_s=0.3) as s:

        async def main() -> list[Any]:
            async with openai.AsyncOpenAI(base_url=f"{s.url}/v1", api_key=API_KEY, max_retries=0, timeout=WAIT) as c:
                hung = c.chat.completions.create(model="hung", messages=chat("hung", "x")["messages"])
                fine = [
                    c.chat.completions.create(model="chain", messages=chat("chain", f"q{i}")["messages"])
                    for i in range(3)
                ]
                return await asyncio.gather(hung, *fine, return_exceptions=True)

        hung, *fine = asyncio.run(main())
        assert isinstance(hung, openai.InternalServerError)
        message = hung.body["message"]  # type: ignore[index]
        assert "TimeoutError: step hang.invoke (call, from hang) ran past its 0.3 s timeout" in message
        assert "in step 'hang'" in message
        assert all(r.choices[0].message.content for r in fine)


# -- disconnects ---------------------------------------------------------------------------
def test_a_client_gone_while_its_body_is_read_is_counted_once() -> None:
    with guarded_server() as s:
        sock = raw_request(s.url, chat("chain", "never finished"), send_bytes=10)
        sock.close()
        s.signals.wait("client left")
        assert s.metric("teola_client_disconnects_total", model="", phase="body") == 1
        assert len(s.signals.matching("client left")) == 1 and noise(s.signals) == []


def test_a_client_gone_while_queued_never_runs() -> None:
    with guarded_server(max_concurrency=1, max_queue=4, queue_timeout_s=WAIT) as s:
        holder = threading.Thread(
            target=lambda: httpx.post(
                f"{s.url}/v1/chat/completions", json=chat("gated", "hold"), headers=HEADERS, timeout=WAIT
            )
        )
        holder.start()
        s.in_model(1)
        queued = s.queued_signal("gated")
        sock = raw_request(s.url, chat("gated", "queued then gone"))
        assert queued.wait(WAIT)
        sock.close()
        s.signals.wait("client left")
        assert s.metric("teola_client_disconnects_total", model="gated", phase="queued") == 1
        assert s.gates["gated"].waiting == 0
        s.gate.set()
        holder.join(WAIT)
        assert s.calls == ["Answer briefly: hold"]  # the one that left never reached the model
        assert len(s.signals.matching("client left")) == 1 and noise(s.signals) == []


def test_a_client_gone_while_running_cancels_its_query() -> None:
    with guarded_server() as s:
        sock = raw_request(s.url, chat("blocking", "running then gone"))
        assert s.started.wait(WAIT)
        sock.close()
        assert s.cancelled.wait(WAIT)
        s.signals.wait("client left")
        assert s.metric("teola_client_disconnects_total", model="blocking", phase="running") == 1
        assert s.metric("teola_admission_running", model="blocking") == 0
        assert len(s.signals.matching("client left")) == 1 and noise(s.signals) == []


def test_a_client_gone_mid_stream_cancels_its_query() -> None:
    with guarded_server() as s:
        with httpx.stream(
            "POST", f"{s.url}/v1/chat/completions", json=chat("blocking", "stream", stream=True), headers=HEADERS
        ) as response:
            for line in response.iter_lines():
                if '"hello"' in line:
                    break
        assert s.cancelled.wait(WAIT)
        s.signals.wait("client left")
        assert s.metric("teola_client_disconnects_total", model="blocking", phase="streaming") == 1
        assert len(s.signals.matching("client left")) == 1 and noise(s.signals) == []
