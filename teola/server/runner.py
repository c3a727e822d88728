"""Running a server: in the foreground (`serve`, the CLI) or in a thread (`BackgroundServer`).

Readiness is an event set when uvicorn has started listening, never a sleep or a poll.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import uvicorn
from fastapi import FastAPI

from teola.server.app import create_app
from teola.server.app_loading import cwd_path, load_apps, wrap_app
from teola.server.apps import App
from teola.server.options import ServeOptions


class _Server(uvicorn.Server):
    """uvicorn's server with a `ready` event, set once startup is over (failed or not)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets)
        finally:
            self.ready.set()


class BackgroundServer:
    """A server on its own event loop in a daemon thread; `start()` returns its base URL.

    with BackgroundServer(create_app(apps)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="...")
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, **config: Any) -> None:
        config.setdefault("log_level", "warning")
        config.setdefault("access_log", False)
        config.setdefault("timeout_graceful_shutdown", 5)
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = host, self._sock.getsockname()[1]
        self.server = _Server(uvicorn.Config(app, lifespan="on", **config))
        self._thread = threading.Thread(target=self._run, name=f"teola-server:{self.port}", daemon=True)
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        try:
            asyncio.run(self.server.serve(sockets=[self._sock]))
        except BaseException as exc:  # kept for start()/stop() to re-raise in the caller's thread
            self._error = exc
            self.server.ready.set()

    def start(self, timeout: float = 30.0) -> str:
        self._thread.start()
        if not self.server.ready.wait(timeout):
            raise TimeoutError(f"server on {self.url} did not start within {timeout}s")
        if not self.server.started:
            raise RuntimeError(f"server on {self.url} failed to start") from self._error
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join()
        self._sock.close()
        if self._error is not None and not isinstance(self._error, SystemExit):
            raise self._error

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def serve(
    apps: Sequence[str | App] | Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    backend: str = "local",
    log_level: str = "info",
    backlog: int = 2048,
    options: ServeOptions | None = None,
    ray_address: str | None = None,
    **changes: Any,
) -> None:
    """Serve apps (specs `name=module:attr`, `App`s, or a {name: runnable} dict) until stopped.

    `options` (a `ServeOptions`) or single fields of it as keywords (`api_key="..."`).
    ray_address: the Ray cluster of `backend="ray"` (default: `RAY_ADDRESS`, else a local one).
    """
    options = replace(options or ServeOptions(), **changes)
    ray = None if ray_address is None else {"address": ray_address}
    if isinstance(apps, dict):
        loaded = [wrap_app(name, obj, backend=backend, ray=ray) for name, obj in apps.items()]
    else:
        specs = [a for a in apps if isinstance(a, str)]
        by_spec = iter(load_apps(specs, backend=backend, search_path=cwd_path(), ray=ray))
        loaded = [next(by_spec) if isinstance(a, str) else a for a in apps]
    app = create_app(loaded, options)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on", backlog=backlog)
    warning = exposure_warning(host, options.api_key)
    if warning:  # uvicorn's logging is configured now: the warning shows where its lines do
        logging.getLogger("uvicorn.error").warning(warning)
    uvicorn.Server(config).run()


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """A loud warning when the server listens beyond this machine with no API key."""
    if api_key is not None or is_loopback(host):
        return None
    return (
        f"\n{'!' * 78}\n"
        f"  teola serve listens on {host!r}, beyond this machine, and NO API KEY is set:\n"
        "  anyone who can reach this port can run your apps (and spend what they spend).\n"
        "  Set one with --api-key or $TEOLA_API_KEY, or listen on 127.0.0.1 only.\n"
        f"{'!' * 78}"
    )


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback address."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)
