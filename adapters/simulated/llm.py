"""A simulated LLM engine: continuous batching, a vLLM-style prefix cache, real streaming.

Tokens are whitespace-separated words (`prompt.split()`): a simulation needs a
tokenizer that is deterministic and cheap, and word counts are close enough to real
token counts to set costs. What the model writes comes from a `responder(prompt,
max_tokens) -> str` (the benchmark workloads supply one that follows their prompts);
the default writes `max_tokens` pseudo-words derived from the prompt. Text is a function
of the prompt alone, so batching, ordering and timing never change an output.

How time is spent (the scheduler of vLLM, reduced to what matters for Teola):

- One step loop serves every active request. Each step admits waiting prefills (up to
  `max_step_tokens` computed tokens; at least one) and advances every decoding sequence
  by one token. A step costs `prefill(computed tokens of the admitted prompts)` plus
  `decode(sequences in the step)` from the profile (a mixed step pays both, as a
  chunked-prefill scheduler does), times `time_scale` (`SimClock` keeps short steps on
  pace despite the event loop's ~1 ms timer granularity). A request's
  result is ready when the step that finishes it ends; streams get each token as its
  step ends. The loop sleeps on an `asyncio.Event` while there is no work.
- Prefills compute only tokens not already held. Held are: whole 16-token blocks found
  in the prefix cache (keyed by the hash chain of block tokens, LRU within
  `cache_tokens`; off with `prefix_cache=False`), and, for a FULL_PREFILL, the tokens
  its `prefix_kv` handle shares with the prompt (the KV of the request's own partial
  prefill, as Ayo's engine appends to a running request). As in vLLM, a prompt that
  feeds a decode always computes at least its last token (it needs the logits).
- A decode of n tokens takes max(1, n) steps. The prompt's KV is held by its handle, so
  decoding never pays for the prompt again (prefill and decode are one request, split
  in two primitives by the IR).

    llm = SimLLM(PROFILE, time_scale=0.0)
    kv = (await llm.run_one(Call("q", prefill_node, {"prompt": "Say hi"})))["kv"]
    text = (await llm.run_one(Call("q", decode_node, {"kv": kv})))["text"]
    llm.stats.prefill_tokens, llm.stats.cache_hit_tokens, llm.stats.steps
"""

from __future__ import annotations

import asyncio
import random
import re
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from teola_adapters._llm import common_prefix, decode_outputs
from teola_adapters.simulated.clock import SimClock, stable_hash
from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.types import KVHandle
from teola_core.profiles.profile import LatencyProfile

Responder = Callable[[str, int], str]

BLOCK_TOKENS = 16
_PIECE = re.compile(r"\s*\S+")
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "da", "po", "gu")
_PREFILLS = frozenset({PrimitiveKind.PREFILL, PrimitiveKind.PARTIAL_PREFILL, PrimitiveKind.FULL_PREFILL})
_DECODES = frozenset({PrimitiveKind.DECODE, PrimitiveKind.PARTIAL_DECODE})


def tokens_of(text: str) -> list[str]:
    """The simulated tokenizer: whitespace-separated words."""
    return text.split()


def token_pieces(text: str) -> list[str]:
    """One piece per token, each with the whitespace before it: `"".join(pieces) == text`.

    Trailing whitespace rides on the last piece. Streaming yields these pieces, so the
    deltas keep the text's newlines (line-split items work) and concatenate exactly.
    """
    pieces = _PIECE.findall(text)
    tail = text[sum(map(len, pieces)) :]
    if tail:
        if pieces:
            pieces[-1] += tail
        else:
            pieces = [tail]
    return pieces


def pseudo_words(prompt: str, max_tokens: int) -> str:
    """The default responder: `max_tokens` pseudo-words, a deterministic function of the prompt."""
    rng = random.Random(stable_hash("responder", prompt))
    return " ".join("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(max_tokens))


class PrefixCache:
    """Whole blocks of prompt tokens, keyed by the hash chain of their tokens, LRU.

    A block's key covers every token before it, so a hit on block i implies the whole
    prefix up to it matches. Only whole blocks are held (a partial last block never is).
    Using a chain refreshes it deepest-block-first, so eviction takes the tails of old
    prefixes before their heads, as vLLM frees blocks.
    """

    def __init__(self, capacity_tokens: int, block_tokens: int = BLOCK_TOKENS) -> None:
        if capacity_tokens < block_tokens:
            raise ValueError(f"prefix cache capacity {capacity_tokens} is below one block ({block_tokens} tokens)")
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_tokens // block_tokens
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def keys(self, tokens: Sequence[str]) -> list[int]:
        keys, parent = [], 0
        for start in range(0, len(tokens) - self.block_tokens + 1, self.block_tokens):
            parent = stable_hash(str(parent), *tokens[start : start + self.block_tokens])
            keys.append(parent)
        return keys

    def probe(self, keys: Sequence[int]) -> int:
        """Leading blocks held, without touching the LRU order."""
        n = 0
        while n < len(keys) and keys[n] in self._blocks:
            n += 1
        return n

    def use(self, keys: Sequence[int]) -> None:
        """The blocks are now held (computed or reused) and most recently used."""
        keys = keys[: self.capacity_blocks]
        for key in reversed(keys):
            self._blocks[key] = None
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)


@dataclass
class LLMStats:
    """What the engine did. `prompt_tokens = prefill_tokens + cache_hit_tokens + handle_hit_tokens`."""

    prefills: int = 0
    decodes: int = 0
    prompt_tokens: int = 0  # tokens of every prefilled prompt
    prefill_tokens: int = 0  # of which computed
    cache_hit_tokens: int = 0  # of which reused from the prefix cache (whole blocks)
    handle_hit_tokens: int = 0  # of which reused from a FULL_PREFILL's prefix_kv beyond the cache
    decode_tokens: int = 0  # tokens generated (one per sequence per step)
    steps: int = 0
    max_running: int = 0  # most sequences decoding in one step
    busy_s: float = 0.0  # simulated, unscaled seconds spent in steps


@dataclass(eq=False)
class _Prefill:
    tokens: list[str]
    handle_tokens: int  # tokens reusable from the request's own prefix handle
    needs_logits: bool
    future: asyncio.Future[None]


@dataclass(eq=False)
class _Sequence:
    pieces: list[str]
    future: asyncio.Future[None] | None = None  # run(): resolved when the last token is out
    queue: asyncio.Queue[str | BaseException | None] | None = None  # stream(): pieces, then None
    emitted: int = 0
    closed: bool = False  # the stream's consumer went away

    @property
    def steps(self) -> int:
        return max(1, len(self.pieces))

    @property
    def abandoned(self) -> bool:
        return self.closed or (self.future is not None and self.future.cancelled())

    def advance(self) -> bool:
        """Produce one token; True when the sequence is finished."""
        if self.queue is not None and self.emitted < len(self.pieces):
            self.queue.put_nowait(self.pieces[self.emitted])
        self.emitted += 1
        if self.emitted < self.steps:
            return False
        if self.future is not None and not self.future.done():
            self.future.set_result(None)
        if self.queue is not None:
            self.queue.put_nowait(None)
        return True

    def fail(self, error: BaseException) -> None:
        if self.future is not None and not self.future.done():
            self.future.set_exception(error)
        if self.queue is not None:
            self.queue.put_nowait(error)


@dataclass(eq=False)
class _LoopState:
    """The step loop's state on one event loop (asyncio objects bind to their loop)."""

    loop: asyncio.AbstractEventLoop
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: deque[_Prefill] = field(default_factory=deque)
    running: list[_Sequence] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


class SimLLM(Engine):
    """PREFILL, PARTIAL_PREFILL, FULL_PREFILL, DECODE and PARTIAL_DECODE on one simulated model.

    Ports: PREFILL `prompt` -> `kv`; PARTIAL_PREFILL `prefix` -> `kv`; FULL_PREFILL
    `prompt`, `prefix_kv` -> `kv`; DECODE `kv` -> `text` (+ `items`, parsed by the node's
    `split_unit`, when it declares that port); PARTIAL_DECODE `kv` -> its chunk of the
    parsed `items` (`decode_chunk` by the node's `index`/`count`, + `text` if declared).
    Prompts are `str`. The decode length is the node's `max_tokens` config (default
    `default_max_tokens`) capped by what the responder writes.
    """

    def __init__(
        self,
        profile: LatencyProfile,
        *,
        time_scale: float = 1.0,
        responder: Responder | None = None,
        prefix_cache: bool = True,
        cache_tokens: int = 16_384,
        max_step_tokens: int = 8_192,
        default_max_tokens: int = 256,
        name: str = "llm",
        concurrency: int = 64,
        instances: int = 1,
    ) -> None:
        """`instances`: how many model instances this engine stands for. The step loop
        simulates their capacity as one running set; a per-invocation policy uses the
        count to run one invocation per instance."""
        for op in ("prefill", "decode"):
            profile.curve(op)  # fail now, not inside the step loop
        if max_step_tokens < 1:
            raise ValueError(f"max_step_tokens must be >= 1, got {max_step_tokens}")
        self.name = name
        self.kinds = _PREFILLS | _DECODES
        self.profile = profile
        self.limits = EngineLimits(concurrency=concurrency, instances=instances)
        self.clock = SimClock(time_scale, concurrency)
        self.responder: Responder = responder or pseudo_words
        self.cache: PrefixCache | None = PrefixCache(cache_tokens) if prefix_cache else None
        self.max_step_tokens = max_step_tokens
        self.default_max_tokens = default_max_tokens
        self.stats = LLMStats()
        self._state: _LoopState | None = None

    # -- the protocol ----------------------------------------------------------------
    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        self._loop_state()  # a stopped step loop fails the batch here, loudly
        results = await asyncio.gather(*(self._run_call(c) for c in calls), return_exceptions=True)
        return list(results)

    async def stream(self, call: Call) -> AsyncIterator[str]:
        """The decode's text, token by token, each delta as its step ends."""
        _, pieces = self._decode_text(call)
        st = self._loop_state()
        queue: asyncio.Queue[str | BaseException | None] = asyncio.Queue()
        seq = _Sequence(pieces, queue=queue)
        self._start_decode(st, seq)
        finished = False
        try:
            while True:
                item = await queue.get()
                if item is None:
                    finished = True
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            seq.closed = not finished  # a consumer that stops early frees its slot

    async def close(self) -> None:
        """Stop the step loop; calls still running fail with a RuntimeError."""
        st = self._state
        if st is None or st.task is None or st.loop.is_closed():
            self._state = None
            return
        if st.loop is not asyncio.get_running_loop():
            raise RuntimeError(f"{self.name}: close() must run on the event loop the engine serves")
        self._state = None
        st.task.cancel()
        await asyncio.wait([st.task])

    # -- what is computed ------------------------------------------------------------
    def generate(self, prompt: str, max_tokens: int) -> str:
        """The decode text for a prompt: the responder's text cut to `max_tokens` tokens."""
        text = self.responder(prompt, max_tokens)
        if not isinstance(text, str):
            raise TypeError(f"{self.name}: the responder returned {type(text).__name__}, not str")
        pieces = token_pieces(text)
        return text if len(pieces) <= max_tokens else "".join(pieces[:max_tokens])

    async def _run_call(self, call: Call) -> Mapping[str, Any]:
        node = call.node
        if node.kind in _PREFILLS:
            port = "prefix" if node.kind == PrimitiveKind.PARTIAL_PREFILL else "prompt"
            prompt = _text(call.inputs[port], port)
            tokens = tokens_of(prompt)
            held = 0
            if node.kind == PrimitiveKind.FULL_PREFILL and call.inputs.get("prefix_kv") is not None:
                prefix = _text(self._own(call.inputs["prefix_kv"]).prompt, "prefix_kv.prompt")
                held = common_prefix(tokens_of(prefix), tokens)
            st = self._loop_state()
            job = _Prefill(tokens, held, node.kind != PrimitiveKind.PARTIAL_PREFILL, st.loop.create_future())
            st.waiting.append(job)
            st.wake.set()
            await job.future
            return {"kv": KVHandle(self.name, prompt)}
        if node.kind in _DECODES:
            text, pieces = self._decode_text(call)
            st = self._loop_state()
            done: asyncio.Future[None] = st.loop.create_future()
            self._start_decode(st, _Sequence(pieces, future=done))
            await done
            return decode_outputs(node, text)
        raise TypeError(f"{self.name} runs LLM primitives, not {node.describe()}")

    def _decode_text(self, call: Call) -> tuple[str, list[str]]:
        if call.node.kind not in _DECODES:
            raise TypeError(f"{self.name} can only stream decode primitives, not {call.node.describe()}")
        if "kv" not in call.inputs:
            raise KeyError(f"{call.node.describe()} has no `kv` input to decode from")
        kv = self._own(call.inputs["kv"])
        max_tokens = int(call.node.config.get("max_tokens", self.default_max_tokens))
        text = self.generate(_text(kv.prompt, "kv.prompt"), max_tokens)
        return text, token_pieces(text)

    def _own(self, handle: Any) -> KVHandle:
        if not isinstance(handle, KVHandle):
            raise TypeError(f"{self.name}: expected a KVHandle, got {type(handle).__name__}")
        if handle.engine != self.name:
            raise ValueError(
                f"{self.name}: KV handle belongs to engine {handle.engine!r}; decode where it was prefilled"
            )
        return handle

    # -- the step loop ---------------------------------------------------------------
    def _loop_state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        st = self._state
        if st is None or st.loop is not loop:
            if st is not None and st.task is not None and not st.task.done() and not st.loop.is_closed():
                raise RuntimeError(f"{self.name} is already serving another event loop")
            st = self._state = _LoopState(loop)
        if st.task is None:
            st.task = loop.create_task(self._steps(st), name=f"{self.name}-steps")
        elif st.task.done():
            cause = None if st.task.cancelled() else st.task.exception()
            raise RuntimeError(f"{self.name}: the step loop has stopped") from cause
        return st

    def _start_decode(self, st: _LoopState, seq: _Sequence) -> None:
        self.stats.decodes += 1
        st.running.append(seq)  # joins at the next step
        st.wake.set()

    async def _steps(self, st: _LoopState) -> None:
        admitted: list[_Prefill] = []
        try:
            while True:
                if not st.waiting and not st.running:
                    st.wake.clear()
                    await st.wake.wait()
                    continue
                admitted, computed = self._admit(st)
                st.running = [s for s in st.running if not s.abandoned]
                batch = tuple(st.running)  # decodes arriving during the step join the next one
                seconds = (self.profile.latency("prefill", computed) if admitted else 0.0) + (
                    self.profile.latency("decode", len(batch)) if batch else 0.0
                )
                self.stats.steps += 1
                self.stats.decode_tokens += len(batch)
                self.stats.max_running = max(self.stats.max_running, len(batch))
                self.stats.busy_s += seconds
                await self.clock.spend(seconds, always_yield=True)  # callers submit work between steps
                for job in admitted:
                    if not job.future.done():
                        job.future.set_result(None)
                admitted = []
                finished = {id(s) for s in batch if s.advance()}
                st.running = [s for s in st.running if id(s) not in finished]
        except BaseException as exc:
            error = (
                RuntimeError(f"{self.name} was closed while the call ran")
                if isinstance(exc, asyncio.CancelledError)
                else exc
            )
            for job in [*admitted, *st.waiting]:
                if not job.future.done():
                    job.future.set_exception(error)
            for seq in st.running:
                seq.fail(error)
            st.waiting.clear()
            st.running.clear()
            raise

    def _admit(self, st: _LoopState) -> tuple[list[_Prefill], int]:
        """Admit waiting prefills FIFO within the step's token budget; charge the cache."""
        admitted: list[_Prefill] = []
        computed = 0
        while st.waiting:
            job = st.waiting[0]
            if job.future.cancelled():
                st.waiting.popleft()
                continue
            n = len(job.tokens)
            keys = self.cache.keys(job.tokens) if self.cache is not None else []
            limit = n - 1 if job.needs_logits and n > 0 else n  # logits need the last token computed
            blocks = self.cache.probe(keys) if self.cache is not None else 0
            cached = min(blocks, limit // BLOCK_TOKENS) * BLOCK_TOKENS  # whole blocks only
            held = min(max(cached, job.handle_tokens), limit)
            cost = n - held
            if admitted and computed + cost > self.max_step_tokens:
                break
            st.waiting.popleft()
            if self.cache is not None:
                self.cache.use(keys)
            admitted.append(job)
            computed += cost
            self.stats.prefills += 1
            self.stats.prompt_tokens += n
            self.stats.prefill_tokens += cost
            self.stats.cache_hit_tokens += cached
            self.stats.handle_hit_tokens += held - cached
        return admitted, computed


def _text(value: Any, port: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"the simulated LLM takes text prompts; {port} is {type(value).__name__}")
    return value
