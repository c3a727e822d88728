"""The simulated OpenAI-compatible servers: one FastAPI app, served by uvicorn in a thread.

    with SimServers(time_scale=0.5) as servers:
        llm = ChatOpenAI(base_url=servers.base_url, api_key="x", temperature=0)

The server runs on an ephemeral 127.0.0.1 port in a thread with its own event loop, so a
benchmark's client loop and the "GPU" loop are separate, as with a real vLLM. Endpoints:
`completions` (chat and text, streaming), `retrieval` (embeddings, rerank, vLLM's
extras; `vllm_api=False` leaves the extras out, as on other servers). `batching` is how
the embedding and rerank instances share concurrent requests (`batcher`).
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from teola_adapters.simulated.paper_profiles import LLM
from teola_adapters.simulated.prefix_cache import BLOCK_TOKENS
from teola_adapters.simulated.servers.backend import ChatScript, SimBackend
from teola_adapters.simulated.servers.batcher import BATCHING_MODES, Batching
from teola_adapters.simulated.servers.completions import chat, completions
from teola_adapters.simulated.servers.responder import ExampleResponder
from teola_adapters.simulated.servers.retrieval import embeddings, metrics, rerank, reset_prefix_cache, tokenize
from teola_adapters.simulated.servers.slots import RequestSlots, SchedulingPolicy
from teola_core.profiles.profile import LatencyProfile


def make_app(backend_factory: Callable[[], SimBackend], ready: threading.Event, vllm_api: bool = True) -> FastAPI:
    """The app; its backend is made at startup, on the server's loop, as `app.state.backend`."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.backend = backend_factory()
        ready.set()
        try:
            yield
        finally:
            await app.state.backend.close()

    app = FastAPI(lifespan=lifespan)
    app.state.ids = itertools.count()
    app.state.vllm_api = vllm_api
    app.add_api_route("/v1/chat/completions", chat, methods=["POST"])
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/v1/embeddings", embeddings, methods=["POST"])
    app.add_api_route("/v1/rerank", rerank, methods=["POST"])
    app.add_api_route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"])
    if vllm_api:
        app.add_api_route("/tokenize", tokenize, methods=["POST"])
        app.add_api_route("/metrics", metrics, methods=["GET"])
    return app


class SimServers:
    """The simulated servers, started in a thread on an ephemeral 127.0.0.1 port.

    Use as a context manager (or `start()`/`stop()`). `base_url` ends in `/v1`, as the
    openai client and `ChatOpenAI(base_url=...)` expect. `backend` is the live engine
    state (read it only after `stop()` or from the server loop: it is not thread-safe).
    `max_num_seqs`, `scheduling_policy`, `llm_profile`, `kv_cache_tokens` and `chat_script`
    are the LLM's, as `SimBackend` takes them.
    """

    def __init__(
        self,
        *,
        time_scale: float = 1.0,
        batching: Batching = "dynamic",
        responder: Callable[[str, int], str] | None = None,
        max_batch_items: int | None = None,
        vllm_api: bool = True,
        max_num_seqs: int | None = None,
        scheduling_policy: SchedulingPolicy = "fcfs",
        llm_profile: LatencyProfile = LLM,
        kv_cache_tokens: int | None = None,
        chat_script: ChatScript | None = None,
    ) -> None:
        if kv_cache_tokens is not None and kv_cache_tokens < BLOCK_TOKENS:
            raise ValueError(f"kv_cache_tokens must be at least one block ({BLOCK_TOKENS}), got {kv_cache_tokens}")
        if batching not in BATCHING_MODES:
            raise ValueError(f"batching must be one of {BATCHING_MODES}, got {batching!r}")
        self.time_scale = time_scale
        self.batching = batching
        self._responder = responder or ExampleResponder()
        self._max_batch_items = max_batch_items
        self._max_num_seqs = max_num_seqs
        self._scheduling_policy = scheduling_policy
        self._llm_options = {"llm_profile": llm_profile, "kv_cache_tokens": kv_cache_tokens, "chat_script": chat_script}
        RequestSlots(max_num_seqs, scheduling_policy)  # bad options fail here, not on the server's thread
        self.vllm_api = vllm_api
        self._app: FastAPI | None = None
        self._thread: threading.Thread | None = None
        self._server: Any = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def backend(self) -> SimBackend:
        backend = getattr(self._app.state, "backend", None) if self._app is not None else None
        if backend is None:
            raise RuntimeError("the simulated servers have not started")
        return backend

    def start(self) -> SimServers:
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)
        self.port = sock.getsockname()[1]
        ready = threading.Event()
        self._app = make_app(
            lambda: SimBackend(
                self.time_scale,
                self.batching,
                self._responder,
                self._max_batch_items,
                self._max_num_seqs,
                self._scheduling_policy,
                **self._llm_options,
            ),
            ready,
            self.vllm_api,
        )
        config = uvicorn.Config(self._app, log_level="warning", access_log=False, lifespan="on", backlog=1024)
        self._server = uvicorn.Server(config)
        errors: list[BaseException] = []

        def serve() -> None:
            try:
                asyncio.run(self._server.serve(sockets=[sock]))
            except BaseException as exc:
                errors.append(exc)
                raise
            finally:
                sock.close()
                ready.set()  # never leave start() waiting on a server that died

        self._thread = threading.Thread(target=serve, name="teola-sim-servers", daemon=True)
        self._thread.start()
        ready.wait()
        if errors or getattr(self._app.state, "backend", None) is None:
            self.stop()
            raise RuntimeError(f"the simulated servers did not start: {errors[0] if errors else 'no backend'}")
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join()
        self._thread = None

    def __enter__(self) -> SimServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
