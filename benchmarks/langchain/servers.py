"""Simulated OpenAI-compatible servers on 127.0.0.1, for benchmarking LangChain chains.

One FastAPI app, served by uvicorn on an ephemeral port in a thread with its own event
loop (so the benchmark's client loop and the "GPU" loop are separate, as they would be
with a real vLLM):

- `POST /v1/chat/completions` and `POST /v1/completions` (both with SSE streaming and
  `stream_options.include_usage`) run on one `SimLLM`: latency by the paper's 7B LLM
  profile, a vLLM-style prefix cache, and continuous batching — concurrent requests
  share decode steps exactly as the simulated engine batches them, whichever client
  sent them.
- What vLLM's server adds to OpenAI's API, so Teola's vLLM engine can warm the prefix
  cache here as on vLLM (`vllm_api=False` leaves them out, as on other servers):
  `POST /tokenize` (a `prompt`, or chat `messages` rendered by the chat template below
  with `add_generation_prompt` / `continue_final_message`), completion prompts given as
  token ids, and `GET /metrics` with `vllm:cache_config_info{block_size="16"}`. Token ids
  number the simulated tokenizer's words (whitespace-separated) in order of first sight,
  so ids decode back to the words and a warm-up fills the same cache blocks as the text.
- `POST /v1/embeddings` (float or base64 encoding) runs on one `SimEmbedder` instance
  with the paper's embedder profile; `POST /v1/rerank` (Cohere/Jina shape) on one
  `SimReranker`. How concurrent requests share that one instance is the
  `batching` option, the same for every client of a server:
    * "request" — each HTTP request is one batch; requests queue for the instance
      (a plain sentence-transformers-behind-HTTP deployment);
    * "dynamic" — requests that arrive while the instance is busy are merged into its
      next batch, up to `max_batch_items` (default: the profile's max efficient batch,
      16 items, where throughput stops growing — a bigger batch only delays everyone in
      it), with no wait window: a lone request never waits for company (TEI-style
      dynamic batching). A request larger than the cap is still one batch.
- `max_num_seqs` (vLLM's option of that name): at most that many LLM requests run at
  once; the others wait, first come first served, for a running one to finish (None:
  every request runs at once, as when the KV cache holds them all).

Text is deterministic (`ExampleResponder`, a function of the prompt alone), so any two
clients that send the same prompt get the same answer, and every client of a server is
served by the same engines: a benchmark that runs two systems against one server
compares them fairly.

    with SimServers(time_scale=0.5) as servers:
        llm = ChatOpenAI(base_url=servers.base_url, api_key="x", temperature=0)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import re
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from teola_adapters.simulated.clock import SimClock
from teola_adapters.simulated.embedding import SimEmbedder
from teola_adapters.simulated.llm import BLOCK_TOKENS, PrefixCache, SimLLM, token_pieces, tokens_of
from teola_adapters.simulated.paper_profiles import EMBEDDER, LLM, LLM_CACHE_TOKENS, RERANKER
from teola_adapters.simulated.reranker import relevance
from teola_benchmarks.workloads.common import words
from teola_core.engines.protocol import Call
from teola_core.ir.kinds import Capabilities, PortSpec, PrimitiveKind, spec_of
from teola_core.ir.node import Node
from teola_core.ir.types import PortType

Batching = Literal["request", "dynamic"]
BATCHING_MODES: tuple[str, ...] = ("request", "dynamic")

_QUERIES = re.compile(
    r"(?:Write|Generate|generate) (\d+) (?:\w+\s+)*?"
    r"(?:(?:search\s+)?queries,\s+one\s+(?:per|on\s+each)\s+line|versions\s+of\s+the\s+given\s+user\s+question)"
)
_LENGTH = re.compile(r"in about (\d+) words")


@dataclass(frozen=True)
class ExampleResponder:
    """What the simulated model writes: a deterministic function of the prompt.

    It follows the examples' instructions: "Write N ... queries, one per line" (and the
    query-generation prompts of LlamaIndex's `QueryFusionRetriever`, "Generate N search
    queries, one on each line", and LangChain's `MultiQueryRetriever`, "generate N
    different versions of the given user question") gives N lines of `query_tokens`
    words; "in about N words" gives N words; anything else `answer_tokens` words. Words
    come from the synthetic corpus' vocabulary, so generated queries retrieve something.
    """

    answer_tokens: int = 48
    query_tokens: int = 10

    def __call__(self, prompt: str, max_tokens: int) -> str:
        m = _QUERIES.search(prompt)
        if m is not None:
            n = int(m.group(1))
            return "\n".join(" ".join(words(f"{prompt}/{i}", self.query_tokens)) for i in range(n))
        m = _LENGTH.search(prompt)
        n = int(m.group(1)) if m is not None else self.answer_tokens
        return " ".join(words(prompt, min(n, max_tokens)))


def messages_to_prompt(
    messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True, continue_final_message: bool = False
) -> str:
    """The prompt text the simulated model sees for a chat request (role-tagged lines): its chat template.

    A chat request renders with the generation prompt (the open assistant turn). As vLLM's
    template options: `continue_final_message` leaves the last message open (nothing after
    its text), so the text is a prefix of any conversation that continues that message.
    """
    parts = []
    for m in messages:
        content = m.get("content") or ""
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"<|{m.get('role', 'user')}|>\n{content}")
    text = "\n".join(parts)
    if continue_final_message:
        return text
    return text + ("\n<|assistant|>\n" if add_generation_prompt else "\n")


def _llm_node(kind: PrimitiveKind, max_tokens: int = 0) -> Node:
    spec = spec_of(kind)
    if kind == PrimitiveKind.DECODE:
        return Node(
            "decode",
            kind,
            (PortSpec("kv", PortType.KV),),
            (PortSpec("text", PortType.TEXT),),
            engine="llm",
            config={"max_tokens": max_tokens},
            caps=Capabilities(batchable=True),
        )
    assert spec.inputs is not None and spec.outputs is not None
    return Node(kind.value, kind, spec.inputs, spec.outputs, engine="llm", caps=spec.caps)


T = TypeVar("T")
R = TypeVar("R")


@dataclass(eq=False)
class _Pending(Generic[T, R]):
    payload: T
    items: int
    future: asyncio.Future[R]


@dataclass(eq=False)
class Batcher(Generic[T, R]):
    """One engine instance serving requests in batches (see the module docstring).

    `run(payloads) -> results` does one batch (it spends the engine's time). In
    "request" mode each request is its own batch; in "dynamic" mode a worker takes every
    request waiting when the instance frees up (up to `max_items` items) as one batch.
    """

    run: Callable[[list[T]], Awaitable[list[R]]]
    mode: Batching
    max_items: int = 64
    _queue: asyncio.Queue[_Pending[T, R]] | None = None
    _worker: asyncio.Task[None] | None = None
    _gate: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def submit(self, payload: T, items: int) -> R:
        if self.mode == "request":
            async with self._gate:  # one instance: requests queue for it
                return (await self.run([payload]))[0]
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._worker = asyncio.get_running_loop().create_task(self._serve(self._queue))
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(payload, items, future))
        return await future

    async def _serve(self, queue: asyncio.Queue[_Pending[T, R]]) -> None:
        carry: _Pending[T, R] | None = None
        while True:
            first = carry if carry is not None else await queue.get()
            carry = None
            batch, total = [first], first.items
            while not queue.empty():
                nxt = queue.get_nowait()
                if total + nxt.items > self.max_items:
                    carry = nxt
                    break
                batch.append(nxt)
                total += nxt.items
            live = [p for p in batch if not p.future.done()]
            if not live:
                continue
            try:
                results = await self.run([p.payload for p in live])
            except Exception as exc:  # the batch failed: every request in it fails with it
                for p in live:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            for p, r in zip(live, results, strict=True):
                if not p.future.done():
                    p.future.set_result(r)

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)


class SimBackend:
    """The engines behind the HTTP endpoints; lives on the server's event loop."""

    def __init__(
        self,
        time_scale: float,
        batching: Batching,
        responder: Callable[[str, int], str],
        max_batch_items: int | None = None,
        max_num_seqs: int | None = None,
    ) -> None:
        self.llm = SimLLM(LLM, time_scale=time_scale, responder=responder, cache_tokens=LLM_CACHE_TOKENS)
        self.llm_slots = asyncio.Semaphore(max_num_seqs) if max_num_seqs else None  # FIFO, as vLLM's waiting queue
        self.embedder = SimEmbedder(EMBEDDER, time_scale=time_scale)
        self.rerank_clock = SimClock(time_scale)
        embed_max = max_batch_items or EMBEDDER.max_efficient_batch("embed")
        rerank_max = max_batch_items or RERANKER.max_efficient_batch("rerank")
        self.embed_batches = Batcher(self._embed_batch, batching, embed_max)
        self.rerank_batches = Batcher(self._rerank_batch, batching, rerank_max)
        self.requests = {"chat": 0, "completions": 0, "embeddings": 0, "rerank": 0, "tokenize": 0}
        self.embed_batch_sizes: list[int] = []
        self._vocabulary: dict[str, int] = {}
        self._words: list[str] = []

    # -- the tokenizer (vLLM's /tokenize and token-id prompts) ---------------------------
    def token_ids(self, text: str) -> list[int]:
        """The simulated tokenizer's ids for `text`: its words, numbered in order of first sight."""
        ids = []
        for word in tokens_of(text):
            if word not in self._vocabulary:
                self._vocabulary[word] = len(self._words)
                self._words.append(word)
            ids.append(self._vocabulary[word])
        return ids

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of token ids: their words, space-separated (the same tokens again)."""
        if not all(isinstance(i, int) and 0 <= i < len(self._words) for i in ids):
            raise ValueError("unknown token id")
        return " ".join(self._words[i] for i in ids)

    # -- LLM ---------------------------------------------------------------------------
    async def _kv(self, prompt: str) -> Any:
        return (await self.llm.run_one(Call("http", _llm_node(PrimitiveKind.PREFILL), {"prompt": prompt})))["kv"]

    async def generate(self, prompt: str, max_tokens: int) -> str:
        async with self._running():
            kv = await self._kv(prompt)
            out = await self.llm.run_one(Call("http", _llm_node(PrimitiveKind.DECODE, max_tokens), {"kv": kv}))
        return str(out["text"])

    async def stream(self, prompt: str, max_tokens: int) -> AsyncIterator[str]:
        async with self._running():
            kv = await self._kv(prompt)
            async for piece in self.llm.stream(Call("http", _llm_node(PrimitiveKind.DECODE, max_tokens), {"kv": kv})):
                yield piece

    def _running(self) -> Any:
        """One of `max_num_seqs` running requests (waiting for one first), or no limit."""
        return self.llm_slots if self.llm_slots is not None else contextlib.nullcontext()

    # -- embeddings and rerank ---------------------------------------------------------
    async def _embed_batch(self, requests: list[list[str]]) -> list[list[list[float]]]:
        items = sum(len(r) for r in requests)
        self.embed_batch_sizes.append(items)
        async with self.embedder.clock.slot():
            await self.embedder.clock.spend(self.embedder.profile.latency("embed", items))
        return [[self.embedder.embed(t) for t in texts] for texts in requests]

    async def _rerank_batch(self, requests: list[tuple[str, list[str]]]) -> list[list[float]]:
        items = sum(len(docs) for _, docs in requests)
        async with self.rerank_clock.slot():
            await self.rerank_clock.spend(RERANKER.latency("rerank", items))
        return [[relevance(q, d) for d in docs] for q, docs in requests]

    async def close(self) -> None:
        await self.embed_batches.close()
        await self.rerank_batches.close()
        await self.llm.close()


def _usage(prompt: str, text: str) -> dict[str, int]:
    p, c = len(tokens_of(prompt)), len(token_pieces(text))
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _sse(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def make_app(
    backend_factory: Callable[[], SimBackend],
    ready: threading.Event,
    holder: list[SimBackend],
    vllm_api: bool = True,
) -> FastAPI:
    """The FastAPI app; the backend is made at startup, on the server's loop (`vllm_api`: see the module doc)."""

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        holder.append(backend_factory())
        ready.set()
        try:
            yield
        finally:
            await holder[0].close()

    app = FastAPI(lifespan=lifespan)
    ids = itertools.count()

    def backend() -> SimBackend:
        return holder[0]

    def max_tokens_of(body: dict[str, Any]) -> int:
        value = body.get("max_completion_tokens") or body.get("max_tokens")
        return int(value) if value else 256

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        b = backend()
        b.requests["chat"] += 1
        prompt = messages_to_prompt(body["messages"])
        model = body.get("model", "sim")
        max_tokens = max_tokens_of(body)
        rid, created = f"chatcmpl-{next(ids)}", int(time.time())
        if not body.get("stream"):
            text = await b.generate(prompt, max_tokens)
            return JSONResponse(
                {
                    "id": rid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop",
                            "logprobs": None,
                        }
                    ],
                    "usage": _usage(prompt, text),
                }
            )
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def events() -> AsyncIterator[bytes]:
            def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
                return {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
                }

            yield _sse(chunk({"role": "assistant", "content": ""}, None))
            text = ""
            async for piece in b.stream(prompt, max_tokens):
                text += piece
                yield _sse(chunk({"content": piece}, None))
            yield _sse(chunk({}, "stop"))
            if include_usage:
                yield _sse(
                    {
                        "id": rid,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": _usage(prompt, text),
                    }
                )
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    def error(message: str, status: int = 400) -> JSONResponse:
        return JSONResponse({"error": {"message": message}}, status_code=status)

    def completion_prompts(prompt: Any) -> list[str] | None:
        """The prompts of a completions request: text, or (vLLM) token ids; None if malformed."""
        if isinstance(prompt, str):
            return [prompt]
        if vllm_api and isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt:
            return None
        texts = []
        for p in prompt:
            if isinstance(p, str):
                texts.append(p)
            elif vllm_api and isinstance(p, list) and all(isinstance(t, int) for t in p):
                try:
                    texts.append(backend().detokenize(p))
                except ValueError:
                    return None
            else:
                return None
        return texts

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        b = backend()
        b.requests["completions"] += 1
        prompts = completion_prompts(body["prompt"])
        if prompts is None:
            return error("prompts must be strings" + (" or token ids" if vllm_api else ""))
        model = body.get("model", "sim")
        max_tokens = int(body.get("max_tokens") or 16)
        rid, created = f"cmpl-{next(ids)}", int(time.time())
        if not body.get("stream"):
            texts = await asyncio.gather(*(b.generate(p, max_tokens) for p in prompts))
            usage = [_usage(p, t) for p, t in zip(prompts, texts, strict=True)]
            return JSONResponse(
                {
                    "id": rid,
                    "object": "text_completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {"index": i, "text": t, "finish_reason": "stop", "logprobs": None} for i, t in enumerate(texts)
                    ],
                    "usage": {k: sum(u[k] for u in usage) for k in usage[0]},
                }
            )
        if len(prompts) != 1:
            return error("streaming takes one prompt")

        async def events() -> AsyncIterator[bytes]:
            def chunk(text: str, finish: str | None) -> dict[str, Any]:
                return {
                    "id": rid,
                    "object": "text_completion",
                    "created": created,
                    "model": model,
                    "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
                }

            async for piece in b.stream(prompts[0], max_tokens):
                yield _sse(chunk(piece, None))
            yield _sse(chunk("", "stop"))
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Any:
        body = await request.json()
        b = backend()
        b.requests["embeddings"] += 1
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if not all(isinstance(t, str) for t in texts):
            return JSONResponse({"error": {"message": "input must be strings (token ids unsupported)"}}, 400)
        vectors = await b.embed_batches.submit(texts, len(texts))
        b64 = body.get("encoding_format") == "base64"
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() if b64 else v,
            }
            for i, v in enumerate(vectors)
        ]
        n = sum(len(tokens_of(t)) for t in texts)
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "model": body.get("model", "sim"),
                "usage": {"prompt_tokens": n, "total_tokens": n},
            }
        )

    if vllm_api:

        @app.post("/tokenize")
        async def tokenize(request: Request) -> Any:
            """vLLM's /tokenize: a `prompt`, or `messages` through the chat template."""
            body = await request.json()
            b = backend()
            b.requests["tokenize"] += 1
            if "messages" in body:
                generation = bool(body.get("add_generation_prompt", True))
                continued = bool(body.get("continue_final_message", False))
                if generation and continued:
                    return error("continue_final_message and add_generation_prompt cannot both be true")
                text = messages_to_prompt(
                    body["messages"], add_generation_prompt=generation, continue_final_message=continued
                )
            elif isinstance(body.get("prompt"), str):
                text = body["prompt"]
            else:
                return error("give a `prompt` string or chat `messages`")
            tokens = b.token_ids(text)
            return JSONResponse({"count": len(tokens), "max_model_len": 32_768, "tokens": tokens})

        @app.get("/metrics")
        async def metrics() -> Any:
            """The line of vLLM's Prometheus metrics that gives the KV block size."""
            return PlainTextResponse(
                f'vllm:cache_config_info{{block_size="{BLOCK_TOKENS}",enable_prefix_caching="True"}} 1.0\n'
            )

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> Any:
        """Empty the LLM's prefix cache (as vLLM's endpoint of that name), between benchmark runs."""
        b = backend()
        if b.llm.cache is not None:
            b.llm.cache = PrefixCache(LLM_CACHE_TOKENS)
        return JSONResponse({"ok": True})

    @app.post("/v1/rerank")
    async def rerank(request: Request) -> Any:
        body = await request.json()
        b = backend()
        b.requests["rerank"] += 1
        query, docs = body["query"], list(body["documents"])
        scores = await b.rerank_batches.submit((query, docs), len(docs))
        order = sorted(range(len(docs)), key=lambda i: -scores[i])  # stable: ties keep input order
        top_n = body.get("top_n")
        results = [{"index": i, "relevance_score": scores[i]} for i in order[: top_n or len(order)]]
        return JSONResponse({"results": results, "model": body.get("model", "sim")})

    return app


class SimServers:
    """The simulated servers, started in a thread on an ephemeral 127.0.0.1 port.

    Use as a context manager (or `start()`/`stop()`). `base_url` ends in `/v1`, as the
    openai client and `ChatOpenAI(base_url=...)` expect. `backend` is the live engine
    state (read it only after `stop()` or from the server loop: it is not thread-safe).
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
    ) -> None:
        if batching not in BATCHING_MODES:
            raise ValueError(f"batching must be one of {BATCHING_MODES}, got {batching!r}")
        self.time_scale = time_scale
        self.batching = batching
        self._responder = responder or ExampleResponder()
        self._max_batch_items = max_batch_items
        self._max_num_seqs = max_num_seqs
        self.vllm_api = vllm_api
        self._holder: list[SimBackend] = []
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
        return self._holder[0]

    def start(self) -> SimServers:
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)
        self.port = sock.getsockname()[1]
        ready = threading.Event()
        app = make_app(
            lambda: SimBackend(
                self.time_scale, self.batching, self._responder, self._max_batch_items, self._max_num_seqs
            ),
            ready,
            self._holder,
            self.vllm_api,
        )
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", backlog=1024)
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
        if errors or not self._holder:
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
