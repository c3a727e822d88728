"""A simulated LLM engine: continuous batching, a vLLM-style prefix cache, real streaming.

    llm = SimLLM(PROFILE, time_scale=0.0)
    kv = (await llm.run_one(Call("q", prefill_node, {"prompt": "Say hi"})))["kv"]
    text = (await llm.run_one(Call("q", decode_node, {"kv": kv})))["text"]
    llm.stats.prefill_tokens, llm.stats.cache_hit_tokens, llm.stats.steps

    llm.retain("agent-7", prompt + text, ttl_s=2.0)   # pinned while the agent's tool runs
    llm.release("agent-7")                            # the agent is back

How a step is timed, what the prefix cache and the KV pool hold: `docs/simulated-engines.md`.
Text is a function of the prompt alone (`responder`), so batching never changes an output.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from itertools import count
from typing import Any

from teola_adapters._llm import check_streamable, common_prefix, decode_outputs
from teola_adapters.simulated.clock import SimClock
from teola_adapters.simulated.llm_state import (
    DecodeSequence,
    LLMStats,
    PrefillJob,
    StepLoopState,
    gap_bucket,
    pool_keys,
    priority_of,
    text_input,
)
from teola_adapters.simulated.prefix_cache import BLOCK_TOKENS, PrefixCache
from teola_adapters.simulated.text import pseudo_words, token_pieces, tokens_of
from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits
from teola_core.engines.retention import KVPool, KVRetention
from teola_core.ir.kinds import DECODE_KINDS, LLM_KINDS, PREFILL_KINDS, PrimitiveKind
from teola_core.ir.types import KVHandle
from teola_core.profiles.profile import LatencyProfile

Responder = Callable[[str, int], str]


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
        max_pinned_fraction: float = 0.5,
        kv_pool: bool = False,
    ) -> None:
        """One model instance (several: `SimReplicas`). `max_pinned_fraction`: the share of
        the prefix cache that `retain` holds may pin together. `kv_pool`: the prefix cache
        is the whole KV pool (`docs/simulated-engines.md`)."""
        for op in ("prefill", "decode"):
            profile.curve(op)  # fail now, not inside the step loop
        if max_step_tokens < 1:
            raise ValueError(f"max_step_tokens must be >= 1, got {max_step_tokens}")
        if not 0 <= max_pinned_fraction <= 1:
            raise ValueError(f"max_pinned_fraction must be in [0, 1], got {max_pinned_fraction}")
        self.name = name
        self.kinds = LLM_KINDS
        self.profile = profile
        self.limits = EngineLimits(concurrency=concurrency)
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
        self._state: StepLoopState | None = None

    # -- the protocol ----------------------------------------------------------------
    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        self._loop_state()  # a stopped step loop fails the batch here, loudly
        results = await asyncio.gather(*(self._run_call(c) for c in calls), return_exceptions=True)
        return list(results)

    async def stream(self, call: Call) -> AsyncIterator[str]:
        """The decode's text, token by token, each delta as its step ends."""
        prompt, _, pieces = self._decodetext_input(call)
        st = self._loop_state()
        queue: asyncio.Queue[str | BaseException | None] = asyncio.Queue()
        seq = DecodeSequence(prompt, pieces, keys=pool_keys(call), queue=queue)
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
        tokens = tokens_of(text_input(text, "text"))
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

    def waiting_for_room(self) -> int:
        """Prompts that found no room in the KV pool at the last step (pool mode), not those
        merely waiting for the next step."""
        st = self._state
        if st is None or not st.room_short:
            return 0
        return sum(1 for *_, job in st.waiting if not job.future.done())

    def kv_capacity_tokens(self) -> int | None:
        return self.cache.capacity_blocks * self.cache.block_tokens if self.cache is not None else None

    def count_tokens(self, text: Any) -> int | None:
        return len(tokens_of(text)) if isinstance(text, str) else None

    def discard(self, text: str, keep: str) -> None:
        """Demote the cached blocks of `text` past the whole blocks of `keep` (shared ones stay)."""
        if self.cache is None:
            return
        kept = len(tokens_of(text_input(keep, "keep"))) // self.cache.block_tokens
        self.cache.demote(self.cache.keys(tokens_of(text_input(text, "text")))[kept:])

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
        if node.kind in PREFILL_KINDS:
            port = "prefix" if node.kind == PrimitiveKind.PARTIAL_PREFILL else "prompt"
            prompt = text_input(call.inputs[port], port)
            tokens = tokens_of(prompt)
            held = 0
            if node.kind == PrimitiveKind.FULL_PREFILL and call.inputs.get("prefix_kv") is not None:
                prefix = text_input(self._own(call.inputs["prefix_kv"]).prompt, "prefix_kv.prompt")
                held = common_prefix(tokens_of(prefix), tokens)
            priority = priority_of(node.config.get("priority", 0))
            st = self._loop_state()
            job = PrefillJob(tokens, held, node.kind != PrimitiveKind.PARTIAL_PREFILL, st.loop.create_future())
            heapq.heappush(st.waiting, (priority, next(st.arrivals), job))
            st.wake.set()
            await job.future
            return {"kv": KVHandle(self.name, prompt, tuple(job.keys or ()) if self.kv_pool else None)}
        if node.kind in DECODE_KINDS:
            prompt, text, pieces = self._decodetext_input(call)
            st = self._loop_state()
            done: asyncio.Future[None] = st.loop.create_future()
            self._start_decode(st, DecodeSequence(prompt, pieces, keys=pool_keys(call), future=done))
            await done
            return decode_outputs(node, text)
        raise TypeError(f"{self.name} runs LLM primitives, not {node.describe()}")

    def _decodetext_input(self, call: Call) -> tuple[str, str, list[str]]:
        """The KV handle's prompt, the decode's text and its pieces."""
        check_streamable(call, self.name)
        if "kv" not in call.inputs:
            raise KeyError(f"{call.node.describe()} has no `kv` input to decode from")
        kv = self._own(call.inputs["kv"])
        max_tokens = int(call.node.config.get("max_tokens", self.default_max_tokens))
        prompt = text_input(kv.prompt, "kv.prompt")
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
    def _loop_state(self) -> StepLoopState:
        loop = asyncio.get_running_loop()
        st = self._state
        if st is None or st.loop is not loop:
            if st is not None and st.task is not None and not st.task.done() and not st.loop.is_closed():
                raise RuntimeError(f"{self.name} is already serving another event loop")
            st = self._state = StepLoopState(loop)
        if st.task is None:
            st.task = loop.create_task(self._steps(st), name=f"{self.name}-steps")
        elif st.task.done():
            cause = None if st.task.cancelled() else st.task.exception()
            raise RuntimeError(f"{self.name}: the step loop has stopped") from cause
        return st

    def _start_decode(self, st: StepLoopState, seq: DecodeSequence) -> None:
        if self.kv_pool and self.cache is not None and seq.keys:
            seq.request = next(self._requests)
            self.cache.run(seq.request, seq.keys)  # in use until the sequence leaves
        self.stats.decodes += 1
        st.running.append(seq)  # joins at the next step
        st.wake.set()

    async def _steps(self, st: StepLoopState) -> None:
        admitted: list[PrefillJob] = []
        try:
            while True:
                if not st.waiting and not st.running:
                    st.wake.clear()
                    await st.wake.wait()
                    continue
                admitted, computed = self._admit(st)
                if not admitted and not st.running:
                    if st.waiting:  # else: the only prompts waiting could never fit and failed
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
                self.stats.prefill_s += seconds * len(admitted)
                gaps = sum(1 for seq in batch if seq.emitted)  # a sequence's first token ends no gap (vLLM's TTFT)
                if gaps:
                    self.stats.token_gap_s += seconds * gaps
                    self.stats.token_gaps[gap_bucket(seconds)] += gaps
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

    async def _wait_for_room(self, st: StepLoopState) -> None:
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

    def _keep_output(self, seq: DecodeSequence) -> None:
        """The sequence left the running set: its prompt and produced text stay cached."""
        if self.cache is None:
            return
        if seq.request is not None:
            self.cache.done(seq.request)
        produced = "".join(seq.pieces[: seq.emitted])
        self.cache.expire(self.clock.now())
        self.cache.use(self.cache.keys(tokens_of(seq.prompt + produced)))

    def _admit(self, st: StepLoopState) -> tuple[list[PrefillJob], int]:
        """Admit waiting prefills by (priority, arrival) within the step's token budget;
        charge the cache."""
        admitted: list[PrefillJob] = []
        computed = 0
        st.room_short = False
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
                st.room_short = True
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
