"""The context's sequences and the saved prefix states: bring a prompt's state into a sequence.

A prefill restores the saved state (or keeps a live sequence) sharing the most whole
chunks with its prompt, evaluates only the rest in canonical chunks (see `lowlevel`) and
saves the result with its last logits, so a split prefill computes bit for bit what one
prefill computes. Evaluation is a generator that yields after every chunk, so the worker
can run a decode step between two chunks of a long prompt:

    seqs = Sequences(llm, StateCache(2**29), stats)
    slot = seqs.pick(tokens)
    logits = drain(seqs.ensure(slot, tokens))     # or advance it one chunk at a time

Runs on the engine's worker thread only.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from teola_adapters._llm import common_prefix
from teola_adapters.llamacpp.lowlevel import BatchedLlama
from teola_adapters.llamacpp.state_cache import SavedState, StateCache, Tokens, aligned

T = TypeVar("T")
Chunks = Generator[None, None, T]  # yields after each evaluated chunk, returns its result


@dataclass
class LlamaCppStats:
    """What the engine computed. `prompt_tokens = computed_tokens + reused_tokens`.

    A "prefill" is every time a prompt's state is brought into a sequence: the prefill
    primitives, and a decode finding its prompt's state. `recomputed_tokens` is the waste
    a bounded state cache causes: evaluated tokens in whole chunks the engine had
    evaluated before (the same tokens from position 0). A prompt's tail past its last
    whole chunk is never reused (canonical chunks), so it does not count as recomputed.
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
class Slot:
    """One sequence of the context: its first cells are the canonical evaluation of `tokens`."""

    index: int
    tokens: Tokens = ()
    logits: Any = None  # the last token's logits while the cells hold exactly `tokens`
    busy: bool = False  # a decode or an unfinished prefill holds it
    used: int = 0  # when it was last picked (ties go to the least recently used)


def drain(chunks: Chunks[T]) -> T:
    """Run an evaluation to its end; its result."""
    while True:
        try:
            next(chunks)
        except StopIteration as done:
            return done.value


class Sequences:
    """The sequences of a `BatchedLlama` and the `StateCache` of saved prefix states."""

    def __init__(self, llm: BatchedLlama, cache: StateCache, stats: LlamaCppStats) -> None:
        self.llm = llm
        self.cache = cache
        self.stats = stats
        self.chunk = llm.chunk
        self.slots = [Slot(i) for i in range(llm.n_seq)]
        self._uses = itertools.count(1)
        self._evaluated_chunks: set[int] = set()  # chunk keys ever evaluated (`_count_recomputed`)

    def free(self) -> int:
        return sum(not s.busy for s in self.slots)

    def pick(self, tokens: Sequence[int]) -> Slot:
        """The idle sequence holding the prompt itself, else most of its whole chunks, else the least recently used."""
        key = tuple(tokens)
        slot = max(
            (s for s in self.slots if not s.busy),
            key=lambda s: (s.tokens == key, aligned(common_prefix(s.tokens, key), self.chunk), -s.used),
        )
        slot.used = next(self._uses)
        return slot

    def ensure(self, slot: Slot, tokens: Sequence[int]) -> Chunks[Any]:
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
        return (yield from self._evaluate(slot, key, start))

    def warm(self, tokens: Sequence[int]) -> Chunks[Tokens]:
        """Partial prefill: make sure some state holds these whole chunks (nothing if one does)."""
        key = tuple(tokens)
        self.stats.prefills += 1
        self.stats.prompt_tokens += len(key)
        live = max(aligned(common_prefix(s.tokens, key), self.chunk) for s in self.slots if not s.busy)
        _, saved = self.cache.best_reuse(key, self.chunk)
        if max(live, saved) >= len(key):
            self.stats.reused_tokens += len(key)
            return key
        slot = self.pick(key)
        yield from self._evaluate(slot, key, self._prepare(slot, key, len(key)))
        return key

    def release(self, slot: Slot, *, failed: bool) -> None:
        """A decode left the sequence: generated tokens follow its prompt (emptied if it failed)."""
        slot.busy = False
        slot.logits = None
        if failed:  # what the sequence holds is unknown
            self.empty(slot)

    def empty(self, slot: Slot) -> None:
        """Drop the sequence's cells (scratch use, e.g. measuring a decode step)."""
        self.llm.truncate(slot.index, 0)
        slot.tokens, slot.logits = (), None

    def forget(self) -> None:
        """Drop every saved state and the idle sequences' contents (cold again)."""
        self.cache.clear()
        self._evaluated_chunks.clear()  # nothing computed next counts as recomputed
        for slot in self.slots:
            if not slot.busy:
                self.empty(slot)

    def _truncate(self, slot: Slot, n: int) -> None:
        """Keep the first n tokens of the sequence (drop its cells beyond them)."""
        self.llm.truncate(slot.index, n)
        if n < len(slot.tokens):
            slot.tokens = slot.tokens[:n]
            slot.logits = None

    def _restore(self, slot: Slot, state: SavedState) -> None:
        self.llm.load(slot.index, state.data, state.nbytes)
        slot.tokens = state.tokens
        slot.logits = state.logits
        self.stats.restores += 1

    def _prepare(self, slot: Slot, tokens: Sequence[int], limit: int) -> int:
        """Bring the sequence to the known state sharing most whole chunks of `tokens` (<= limit)."""
        live = aligned(common_prefix(slot.tokens, tokens), self.chunk)
        state, saved = self.cache.best_reuse(tokens, self.chunk)
        if state is not None and saved > live:
            self._restore(slot, state)
            live = saved
        start = min(live, aligned(limit, self.chunk))
        self._truncate(slot, start)
        return start

    def _evaluate(self, slot: Slot, tokens: Sequence[int], start: int) -> Chunks[Any]:
        """Evaluate tokens[start:] (start on a chunk boundary) a chunk at a time; save and
        return the last logits. The sequence is busy until then (emptied if evaluation fails)."""
        was_busy, slot.busy = slot.busy, True
        slot.tokens, slot.logits = tuple(tokens[:start]), None
        try:
            last = 0
            for begin in range(start, len(tokens), self.chunk):
                began = time.perf_counter()
                last = self.llm.eval_chunk(slot.index, tokens, begin)
                self.stats.prefill_s += time.perf_counter() - began
                if begin + self.chunk < len(tokens):
                    yield
            began = time.perf_counter()
            logits = self.llm.logits(last)
            slot.tokens, slot.logits = tuple(tokens), logits
            data, nbytes = self.llm.save(slot.index)
            self.cache.put(SavedState(slot.tokens, data, nbytes, logits))
            self.stats.prefill_s += time.perf_counter() - began
        except BaseException:
            self.empty(slot)
            raise
        finally:
            slot.busy = was_busy
        self.stats.computed_tokens += len(tokens) - start
        self.stats.reused_tokens += start
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
