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
- Waiting prefills are admitted by (priority, arrival): a call's priority is its node's
  `priority` config (default 0, lower first, as vLLM's priority scheduling). Order
  changes, outputs never do.
- A decode of n tokens takes max(1, n) steps. The prompt's KV is held by its handle, so
  decoding never pays for the prompt again (prefill and decode are one request, split
  in two primitives by the IR). When a decode leaves the running set (finished, or its
  caller gone), the whole blocks of its prompt followed by the text it produced enter
  the prefix cache, as vLLM keeps a finished request's blocks: an agent's next prompt,
  which begins with prompt + answer, computes only what follows.

Agents (`KVRetention`): `retain(program, text, ttl_s)` pins the cached leading blocks of
`text` until `ttl_s` simulated seconds from now (`SimClock.now()`: wall time / time
scale, or the time spent in steps at scale 0); eviction passes over pinned blocks.
Pinning computes nothing: blocks not in the cache are not held. At most
`max_pinned_fraction` of the cache may be pinned; a hold beyond it is refused. Expired
holds are dropped lazily, when the cache takes new blocks or `held_programs()` is asked.
`discard(text, keep)` moves a finished program's blocks past `keep` to the front of the
LRU order; `kv_capacity_tokens()` and `count_tokens()` (words) let the agent runtime
admit programs by the size of their contexts.

By default the prefix cache (`cache_tokens`) holds only finished work: running
sequences do not take room from it. With `kv_pool=True` it is the whole KV pool, as in
vLLM: a decoding sequence's prompt blocks are in use (not evictable) until it finishes,
and a prefill waits, in priority order, until its blocks fit beside the running ones
and the holds (`stats.pool_waits` counts the steps it waited). Between a prefill and
the start of its decode (the next primitive) the blocks are cached but not in use, so
a prefilled handle that is never decoded holds nothing. The generated tokens'
blocks are not reserved while decoding (a simplification: vLLM would preempt).

    llm = SimLLM(PROFILE, time_scale=0.0)
    kv = (await llm.run_one(Call("q", prefill_node, {"prompt": "Say hi"})))["kv"]
    text = (await llm.run_one(Call("q", decode_node, {"kv": kv})))["text"]
    llm.stats.prefill_tokens, llm.stats.cache_hit_tokens, llm.stats.steps

    llm.retain("agent-7", prompt + text, ttl_s=2.0)   # pinned while the agent's tool runs
    llm.release("agent-7")                            # the agent is back
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import heapq
import math
import random
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from teola_adapters._llm import common_prefix, decode_outputs
from teola_adapters.simulated.clock import SimClock, stable_hash
from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits
from teola_core.engines.retention import KVPool, KVRetention
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


def _block_key(parent: int, block: Sequence[str]) -> int:
    """The key of a block after the block keyed `parent` (0 for the first): stable across
    processes. Tokens hold no whitespace, so joining them by a space is unambiguous."""
    data = parent.to_bytes(8, "little") + " ".join(block).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@dataclass(frozen=True)
class _Hold:
    keys: tuple[int, ...]
    until: float
    serial: int


class PrefixCache:
    """Whole blocks of prompt tokens, keyed by the hash chain of their tokens, LRU, with holds.

    A block's key covers every token before it, so a hit on block i implies the whole
    prefix up to it matches. Only whole blocks are held (a partial last block never is).
    Using a chain refreshes it deepest-block-first, so eviction takes the tails of old
    prefixes before their heads, as vLLM frees blocks.

    A hold pins an owner's blocks until a deadline: pinned blocks keep their place in
    the LRU order, but eviction passes over them. A block several holds share is pinned
    (and counted) once. Holds end by `drop`, or by `expire(now)` once past their
    deadline; the cache reads no clock. The cache also remembers every block it ever
    held, so computing one again can be told from computing it the first time.

        cache.use(keys)                                  # computed: now cached, LRU
        cache.hold("agent-7", keys, until=12.5, max_pinned=64)
        cache.expire(now=13.0)                           # agent-7's blocks may go again
    """

    def __init__(self, capacity_tokens: int, block_tokens: int = BLOCK_TOKENS) -> None:
        if capacity_tokens < block_tokens:
            raise ValueError(f"prefix cache capacity {capacity_tokens} is below one block ({block_tokens} tokens)")
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_tokens // block_tokens
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self._seen: set[int] = set()  # every block ever held
        self._pins: dict[int, int] = {}  # block -> holds pinning it
        self._running: dict[int, int] = {}  # block -> running requests using it (pool mode)
        self._taken: dict[int, int] = {}  # block -> holds + running requests: the blocks eviction skips
        self._requests: dict[int, tuple[int, ...]] = {}  # running request -> its blocks
        self._holds: dict[str, _Hold] = {}
        self._deadlines: list[tuple[float, int, str]] = []  # heap of (until, serial, owner); stale ones skipped
        self._serials = count()

    def __len__(self) -> int:
        return len(self._blocks)

    def keys(self, tokens: Sequence[str]) -> list[int]:
        keys, parent = [], 0
        for start in range(0, len(tokens) - self.block_tokens + 1, self.block_tokens):
            parent = _block_key(parent, tokens[start : start + self.block_tokens])
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
        self._seen.update(keys)
        excess = len(self._blocks) - self.capacity_blocks
        if excess > 0:
            victims = []
            for key in self._blocks:  # least recently used first, pinned ones passed over
                if key not in self._taken:
                    victims.append(key)
                    if len(victims) == excess:
                        break
            for key in victims:
                del self._blocks[key]

    def demote(self, keys: Sequence[int]) -> None:
        """The blocks will not be used again: first in line for eviction, deepest first."""
        for key in keys:
            if key in self._blocks:
                self._blocks.move_to_end(key, last=False)

    def evicted(self, key: int) -> bool:
        """The block was held once and is not now (computing it is computing it again)."""
        return key in self._seen and key not in self._blocks

    # -- running requests (pool mode) ---------------------------------------------------
    def room_for(self, keys: Sequence[int]) -> bool:
        """Would the blocks fit beside every pinned and running block (the rest can go)?"""
        taken = self._taken
        return len(taken) + sum(1 for key in set(keys) if key not in taken) <= self.capacity_blocks

    def run(self, request: int, keys: Sequence[int]) -> None:
        """A request's blocks are in use until `done(request)`: eviction passes over them."""
        blocks = tuple(keys)
        self._requests[request] = blocks
        for key in blocks:
            self._running[key] = self._running.get(key, 0) + 1
            self._take(key)

    def done(self, request: int) -> None:
        for key in self._requests.pop(request, ()):
            _decrement(self._running, key)
            _decrement(self._taken, key)

    @property
    def running_blocks(self) -> int:
        return len(self._running)

    @property
    def running_requests(self) -> int:
        return len(self._requests)

    # -- holds -----------------------------------------------------------------------
    @property
    def pinned_blocks(self) -> int:
        return len(self._pins)

    def hold(self, owner: str, keys: Sequence[int], until: float, max_pinned: int) -> bool:
        """Pin the leading cached blocks of `keys` for `owner` until `until`, replacing its
        hold. False, and no hold, when none of them is cached or the pinned blocks would
        exceed `max_pinned`."""
        self.drop(owner)
        held = tuple(keys[: self.probe(keys)])
        new = sum(1 for key in held if key not in self._pins)
        if not held or len(self._pins) + new > max_pinned:
            return False
        for key in held:
            self._pins[key] = self._pins.get(key, 0) + 1
            self._take(key)
        hold = self._holds[owner] = _Hold(held, until, next(self._serials))
        heapq.heappush(self._deadlines, (until, hold.serial, owner))
        return True

    def drop(self, owner: str) -> None:
        """End the owner's hold, if any; its blocks stay cached, in their LRU place."""
        hold = self._holds.pop(owner, None)
        if hold is None:
            return
        for key in hold.keys:
            _decrement(self._pins, key)
            _decrement(self._taken, key)
        if len(self._deadlines) > 2 * len(self._holds) + 64:  # mostly dropped holds' deadlines
            self._deadlines = [(h.until, h.serial, o) for o, h in self._holds.items()]
            heapq.heapify(self._deadlines)

    def expire(self, now: float) -> None:
        """End the holds whose deadline is `now` or earlier."""
        while self._deadlines and self._deadlines[0][0] <= now:
            _, serial, owner = heapq.heappop(self._deadlines)
            hold = self._holds.get(owner)
            if hold is not None and hold.serial == serial:
                self.drop(owner)

    def _take(self, key: int) -> None:
        self._taken[key] = self._taken.get(key, 0) + 1

    def next_deadline(self) -> float | None:
        """When the next hold ends (None: no hold)."""
        while self._deadlines:
            until, serial, owner = self._deadlines[0]
            hold = self._holds.get(owner)
            if hold is not None and hold.serial == serial:
                return until
            heapq.heappop(self._deadlines)
        return None

    def holders(self) -> frozenset[str]:
        """Owners with a hold (as of the last `expire`)."""
        return frozenset(self._holds)


def _decrement(counts: dict[int, int], key: int) -> None:
    if counts[key] == 1:
        del counts[key]
    else:
        counts[key] -= 1


@dataclass
class LLMStats:
    """What the engine did. `prompt_tokens = prefill_tokens + cache_hit_tokens + handle_hit_tokens`."""

    prefills: int = 0
    decodes: int = 0
    prompt_tokens: int = 0  # tokens of every prefilled prompt
    prefill_tokens: int = 0  # of which computed
    cache_hit_tokens: int = 0  # of which reused from the prefix cache (whole blocks)
    handle_hit_tokens: int = 0  # of which reused from a FULL_PREFILL's prefix_kv beyond the cache
    recomputed_tokens: int = 0  # of the computed ones, those in blocks the cache had held and evicted
    pool_waits: int = 0  # steps whose next prefill waited for room in the KV pool (kv_pool mode)
    decode_tokens: int = 0  # tokens generated (one per sequence per step)
    steps: int = 0
    max_running: int = 0  # most sequences decoding in one step
    busy_s: float = 0.0  # simulated, unscaled seconds spent in steps

    @property
    def prefix_hit_rate(self) -> float:
        """Share of prompt tokens not computed (reused from the cache or a handle); 0 without prompts."""
        if not self.prompt_tokens:
            return 0.0
        return (self.cache_hit_tokens + self.handle_hit_tokens) / self.prompt_tokens


@dataclass(eq=False)
class _Prefill:
    tokens: list[str]
    handle_tokens: int  # tokens reusable from the request's own prefix handle
    needs_logits: bool
    future: asyncio.Future[None]
    keys: list[int] | None = None  # its blocks' cache keys, hashed once (a job may wait many steps)


@dataclass(eq=False)
class _Sequence:
    prompt: str  # the KV handle's prompt: its blocks and the produced text's are cached at the end
    pieces: list[str]
    keys: tuple[int, ...] | None = None  # pool mode: its prompt's blocks, in use while it runs
    request: int | None = None  # pool mode: set while its blocks are in use
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
    waiting: list[tuple[float, int, _Prefill]] = field(default_factory=list)  # heap by (priority, arrival)
    arrivals: count[int] = field(default_factory=count)
    running: list[_Sequence] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


class SimLLM(Engine, KVRetention, KVPool):
    """PREFILL, PARTIAL_PREFILL, FULL_PREFILL, DECODE and PARTIAL_DECODE on one simulated model.

    Ports: PREFILL `prompt` -> `kv`; PARTIAL_PREFILL `prefix` -> `kv`; FULL_PREFILL
    `prompt`, `prefix_kv` -> `kv`; DECODE `kv` -> `text` (+ `items`, parsed by the node's
    `split_unit`, when it declares that port); PARTIAL_DECODE `kv` -> its chunk of the
    parsed `items` (by the node's `part`, a `DecodePart`; + `text` if declared).
    Prompts are `str`. The decode length is the node's `max_tokens` config (default
    `default_max_tokens`) capped by what the responder writes; a prefill's queue priority
    is its node's `priority` config (default 0, lower first).
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
        max_pinned_fraction: float = 0.5,
        kv_pool: bool = False,
    ) -> None:
        """`instances`: how many model instances this engine stands for. The step loop
        simulates their capacity as one running set; a per-invocation policy uses the
        count to run one invocation per instance. `max_pinned_fraction`: the share of the
        prefix cache that `retain` holds may pin together. `kv_pool`: the prefix cache is
        the whole KV pool (see the module docstring)."""
        for op in ("prefill", "decode"):
            profile.curve(op)  # fail now, not inside the step loop
        if max_step_tokens < 1:
            raise ValueError(f"max_step_tokens must be >= 1, got {max_step_tokens}")
        if not 0 <= max_pinned_fraction <= 1:
            raise ValueError(f"max_pinned_fraction must be in [0, 1], got {max_pinned_fraction}")
        self.name = name
        self.kinds = _PREFILLS | _DECODES
        self.profile = profile
        self.limits = EngineLimits(concurrency=concurrency, instances=instances)
        self.clock = SimClock(time_scale, concurrency)
        self.responder: Responder = responder or pseudo_words
        self.cache: PrefixCache | None = PrefixCache(cache_tokens) if prefix_cache else None
        self.max_step_tokens = max_step_tokens
        self.default_max_tokens = default_max_tokens
        self.max_pinned_fraction = max_pinned_fraction
        if kv_pool and self.cache is None:
            raise ValueError("kv_pool needs the prefix cache (prefix_cache=True)")
        self.kv_pool = kv_pool
        self._requests = count()
        self.stats = LLMStats()
        self._state: _LoopState | None = None

    # -- the protocol ----------------------------------------------------------------
    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        self._loop_state()  # a stopped step loop fails the batch here, loudly
        results = await asyncio.gather(*(self._run_call(c) for c in calls), return_exceptions=True)
        return list(results)

    async def stream(self, call: Call) -> AsyncIterator[str]:
        """The decode's text, token by token, each delta as its step ends."""
        prompt, _, pieces = self._decode_text(call)
        st = self._loop_state()
        queue: asyncio.Queue[str | BaseException | None] = asyncio.Queue()
        seq = _Sequence(prompt, pieces, keys=_pool_keys(call), queue=queue)
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

    # -- KV retention (agents) ---------------------------------------------------------
    def retain(self, program: str, text: str, ttl_s: float) -> bool:
        """Pin the cached leading blocks of `text` for `ttl_s` simulated seconds.

        Replaces the program's hold. False, holding nothing, when `ttl_s <= 0`, the prefix
        cache is off, no whole block of `text` is cached, or the pins would exceed
        `max_pinned_fraction` of the cache.
        """
        tokens = tokens_of(_text(text, "text"))
        cache = self.cache
        if cache is None:
            return False
        cache.drop(program)
        if not ttl_s > 0:  # NaN too
            return False
        now = self.clock.now()
        cache.expire(now)
        return cache.hold(program, cache.keys(tokens), now + ttl_s, self.max_pinned_blocks)

    def release(self, program: str) -> None:
        if self.cache is not None:
            self.cache.drop(program)

    def held_programs(self) -> frozenset[str]:
        if self.cache is None:
            return frozenset()
        self.cache.expire(self.clock.now())
        return self.cache.holders()

    def kv_capacity_tokens(self) -> int | None:
        return self.cache.capacity_blocks * self.cache.block_tokens if self.cache is not None else None

    def count_tokens(self, text: Any) -> int | None:
        return len(tokens_of(text)) if isinstance(text, str) else None

    def discard(self, text: str, keep: str) -> None:
        """Demote the cached blocks of `text` past the whole blocks of `keep` (shared ones stay)."""
        if self.cache is None:
            return
        kept = len(tokens_of(_text(keep, "keep"))) // self.cache.block_tokens
        self.cache.demote(self.cache.keys(tokens_of(_text(text, "text")))[kept:])

    def reload_seconds(self, text: str) -> float | None:
        """The profiled prefill time of `text` from nothing (unscaled seconds)."""
        if not isinstance(text, str):
            return None
        return self.profile.latency("prefill", len(tokens_of(text)))

    @property
    def max_pinned_blocks(self) -> int:
        return int(self.max_pinned_fraction * self.cache.capacity_blocks) if self.cache is not None else 0

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
            priority = _priority(node.config.get("priority", 0))
            st = self._loop_state()
            job = _Prefill(tokens, held, node.kind != PrimitiveKind.PARTIAL_PREFILL, st.loop.create_future())
            heapq.heappush(st.waiting, (priority, next(st.arrivals), job))
            st.wake.set()
            await job.future
            return {"kv": KVHandle(self.name, prompt, tuple(job.keys or ()) if self.kv_pool else None)}
        if node.kind in _DECODES:
            prompt, text, pieces = self._decode_text(call)
            st = self._loop_state()
            done: asyncio.Future[None] = st.loop.create_future()
            self._start_decode(st, _Sequence(prompt, pieces, keys=_pool_keys(call), future=done))
            await done
            return decode_outputs(node, text)
        raise TypeError(f"{self.name} runs LLM primitives, not {node.describe()}")

    def _decode_text(self, call: Call) -> tuple[str, str, list[str]]:
        """The KV handle's prompt, the decode's text and its pieces."""
        if call.node.kind not in _DECODES:
            raise TypeError(f"{self.name} can only stream decode primitives, not {call.node.describe()}")
        if "kv" not in call.inputs:
            raise KeyError(f"{call.node.describe()} has no `kv` input to decode from")
        kv = self._own(call.inputs["kv"])
        max_tokens = int(call.node.config.get("max_tokens", self.default_max_tokens))
        prompt = _text(kv.prompt, "kv.prompt")
        text = self.generate(prompt, max_tokens)
        return prompt, text, token_pieces(text)

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
        if self.kv_pool and self.cache is not None and seq.keys:
            seq.request = next(self._requests)
            self.cache.run(seq.request, seq.keys)  # in use until the sequence leaves
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
                if not admitted and not st.running:
                    await self._wait_for_room(st)  # pool mode: every waiting prefill needs room
                    continue
                for seq in st.running:
                    if seq.abandoned:
                        self._keep_output(seq)
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
                for seq in batch:
                    if id(seq) in finished:
                        self._keep_output(seq)
                st.running = [s for s in st.running if id(s) not in finished]
        except BaseException as exc:
            error = (
                RuntimeError(f"{self.name} was closed while the call ran")
                if isinstance(exc, asyncio.CancelledError)
                else exc
            )
            for job in [*admitted, *(job for _, _, job in st.waiting)]:
                if not job.future.done():
                    job.future.set_exception(error)
            for seq in st.running:
                seq.fail(error)
            st.waiting.clear()
            st.running.clear()
            raise

    async def _wait_for_room(self, st: _LoopState) -> None:
        """Nothing runs and no waiting prefill fits: wait for a hold to end or new work.

        Only agent holds can be in the way then (running sequences free their blocks when
        they end, and none runs); a prefill that cannot fit even without them fails,
        naming the pool.
        """
        assert self.cache is not None
        deadline = self.cache.next_deadline()
        if deadline is None:
            _, _, job = heapq.heappop(st.waiting)
            job.future.set_exception(
                RuntimeError(
                    f"{self.name}: a prompt of {len(job.tokens)} tokens does not fit the KV pool "
                    f"({self.cache.capacity_blocks * BLOCK_TOKENS} tokens)"
                )
            )
            return
        st.wake.clear()
        wait = (deadline - self.clock.now()) * self.clock.time_scale
        if wait <= 0:
            await asyncio.sleep(0)  # the hold is over: the next admission expires it
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(st.wake.wait(), timeout=wait)

    def _keep_output(self, seq: _Sequence) -> None:
        """The sequence left the running set: its prompt and produced text stay cached."""
        if self.cache is None:
            return
        if seq.request is not None:
            self.cache.done(seq.request)
        produced = "".join(seq.pieces[: seq.emitted])
        self.cache.expire(self.clock.now())
        self.cache.use(self.cache.keys(tokens_of(seq.prompt + produced)))

    def _admit(self, st: _LoopState) -> tuple[list[_Prefill], int]:
        """Admit waiting prefills by (priority, arrival) within the step's token budget;
        charge the cache."""
        admitted: list[_Prefill] = []
        computed = 0
        if self.cache is not None and st.waiting:
            self.cache.expire(self.clock.now())
        while st.waiting:
            job = st.waiting[0][2]
            if job.future.cancelled():
                heapq.heappop(st.waiting)
                continue
            n = len(job.tokens)
            if job.keys is None:
                job.keys = self.cache.keys(job.tokens) if self.cache is not None else []
            keys = job.keys
            limit = n - 1 if job.needs_logits and n > 0 else n  # logits need the last token computed
            blocks = self.cache.probe(keys) if self.cache is not None else 0
            cached = min(blocks, limit // BLOCK_TOKENS) * BLOCK_TOKENS  # whole blocks only
            held = min(max(cached, job.handle_tokens), limit)
            cost = n - held
            if admitted and computed + cost > self.max_step_tokens:
                break
            if self.kv_pool and self.cache is not None and not self.cache.room_for(keys):
                if len(keys) > self.cache.capacity_blocks:
                    heapq.heappop(st.waiting)
                    job.future.set_exception(
                        RuntimeError(
                            f"{self.name}: a prompt of {n} tokens does not fit the KV pool "
                            f"({self.cache.capacity_blocks * BLOCK_TOKENS} tokens)"
                        )
                    )
                    continue
                self.stats.pool_waits += 1
                break  # the head of the queue waits for room; nothing overtakes it
            heapq.heappop(st.waiting)
            recomputed = 0
            if self.cache is not None:
                for i, key in enumerate(keys):
                    end = (i + 1) * BLOCK_TOKENS
                    if end > held and self.cache.evicted(key):
                        recomputed += end - max(held, end - BLOCK_TOKENS)
                self.cache.use(keys)
            admitted.append(job)
            computed += cost
            self.stats.prefills += 1
            self.stats.prompt_tokens += n
            self.stats.prefill_tokens += cost
            self.stats.cache_hit_tokens += cached
            self.stats.handle_hit_tokens += held - cached
            self.stats.recomputed_tokens += recomputed
        return admitted, computed


def _priority(value: Any) -> float:
    """A node's `priority` config: a number (lower runs first)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"a prefill's priority must be a number, got {value!r}")
    if math.isnan(value):
        raise ValueError("a prefill's priority must be a number, got NaN")
    return float(value)


def _pool_keys(call: Call) -> tuple[int, ...] | None:
    """The prompt's block keys a decode's KV handle carries (kv_pool mode), if any."""
    kv = call.inputs.get("kv")
    token = kv.token if isinstance(kv, KVHandle) else None
    return token if isinstance(token, tuple) else None


def _text(value: Any, port: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"the simulated LLM takes text prompts; {port} is {type(value).__name__}")
    return value
