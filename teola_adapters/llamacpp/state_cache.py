"""Saved sequence states by their exact tokens: LRU, bounded in bytes, some held for programs.

A state holds the canonical evaluation of its tokens (see the engine's module doc), so
it serves a prompt up to the last chunk boundary the two share (`best_reuse`).

Holds are KV retention for agents (`teola_core.engines.retention`): `hold(program,
tokens, chunk, ttl_s)` protects from eviction, for `ttl_s` seconds of the cache's clock,
the state that serves `tokens` best. Held states count in the byte budget like any
other; together they may take at most `hold_bytes` (default: half the capacity, so
shared prefixes and prompts waiting for their decode keep room), and a hold beyond that
is refused. One hold per program; an expired hold protects nothing.

    cache = StateCache(64 * 2**20, clock=clock)
    cache.hold("agent-7", tokens, chunk=32, ttl_s=2.5)   # tokens it serves (0: refused)
    cache.release("agent-7")

Thread-safe: the engine's worker saves and looks up states while holds are taken and
released on the caller's thread.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from teola_adapters._llm import common_prefix

Tokens = tuple[int, ...]


@dataclass(frozen=True, eq=False)
class SavedState:
    """A sequence's KV holding exactly `tokens`, and the logits after the last one."""

    tokens: Tokens
    data: Any  # a ctypes byte array (llama.cpp's sequence state)
    nbytes: int
    logits: Any  # numpy float32 array, one row (n_vocab)


def aligned(n: int, chunk: int) -> int:
    """The last chunk boundary at or below n."""
    return n // chunk * chunk


class StateCache:
    """Saved states by their exact tokens, LRU, bounded in bytes (about 23 KB a token for SmolLM2)."""

    def __init__(
        self, capacity_bytes: int, *, hold_bytes: int | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"state cache capacity must be >= 0 bytes, got {capacity_bytes}")
        if hold_bytes is not None and not 0 <= hold_bytes <= capacity_bytes:
            raise ValueError(f"hold_bytes must be between 0 and the capacity {capacity_bytes}, got {hold_bytes}")
        self.capacity_bytes = capacity_bytes
        self.hold_bytes = capacity_bytes // 2 if hold_bytes is None else hold_bytes
        self.nbytes = 0
        self._clock = clock
        self._states: OrderedDict[Tokens, SavedState] = OrderedDict()  # least recently used first
        self._consumed: OrderedDict[Tokens, None] = OrderedDict()  # demoted, least recently first
        self._holds: dict[str, tuple[Tokens, float]] = {}  # program -> (held state's tokens, deadline)
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, tokens: object) -> bool:
        return tokens in self._states

    def get(self, tokens: Tokens) -> SavedState | None:
        with self._lock:
            state = self._states.get(tokens)
            if state is not None:
                self._touch(tokens)
            return state

    def best_reuse(self, tokens: Sequence[int], chunk: int) -> tuple[SavedState | None, int]:
        """The state whose tokens share the most whole chunks with `tokens`, and how many tokens that is."""
        with self._lock:
            best, reuse = self._best(tokens, chunk)
            if best is not None:
                self._touch(best.tokens)
            return best, reuse

    def put(self, state: SavedState) -> None:
        """Keep the state (most recent), evicting unheld ones beyond the capacity: consumed ones
        first, then the least recently used."""
        with self._lock:
            held = self._held_keys()
            self._drop(state.tokens)
            if state.tokens not in held and state.nbytes > self.capacity_bytes - self._bytes_of(held):
                return  # larger than all the room left: keeping it would evict everything for nothing
            self._states[state.tokens] = state
            self.nbytes += state.nbytes
            for key in [*self._consumed, *self._states]:
                if self.nbytes <= self.capacity_bytes:
                    break
                if key not in held:
                    self._drop(key)

    def demote(self, tokens: Tokens) -> None:
        """Mark the state consumed (a decoded prompt: useful only if a program comes back with
        it, e.g. an agent after its tool call): evicted before any unconsumed state, the
        earliest consumed first. Using it again makes it an ordinary state."""
        with self._lock:
            if tokens in self._states:
                self._consumed[tokens] = None
                self._consumed.move_to_end(tokens)

    def clear(self) -> None:
        """Drop every state and hold."""
        with self._lock:
            self._states.clear()
            self._consumed.clear()
            self._holds.clear()
            self.nbytes = 0

    def _best(self, tokens: Sequence[int], chunk: int) -> tuple[SavedState | None, int]:
        best: SavedState | None = None
        reuse = 0
        for key, state in self._states.items():
            n = aligned(common_prefix(key, tokens), chunk)
            if n > reuse:
                best, reuse = state, n
        return best, reuse

    def _touch(self, tokens: Tokens) -> None:
        self._states.move_to_end(tokens)
        self._consumed.pop(tokens, None)

    def _drop(self, tokens: Tokens) -> None:
        old = self._states.pop(tokens, None)
        if old is not None:
            self.nbytes -= old.nbytes
        self._consumed.pop(tokens, None)

    # -- holds -----------------------------------------------------------------------------
    def hold(self, program: str, tokens: Sequence[int], chunk: int, ttl_s: float) -> int:
        """Protect the state serving `tokens` best for `ttl_s` seconds, replacing the program's
        hold; return how many tokens of `tokens` it serves (0: refused, nothing held)."""
        with self._lock:
            self._holds.pop(program, None)
            if ttl_s <= 0:
                return 0
            best, reuse = self._best(tokens, chunk)  # a hold is no use: once expired, it goes as it would have
            if best is None:
                return 0
            held = self._held_keys()
            if best.tokens not in held and self._bytes_of(held) + best.nbytes > self.hold_bytes:
                return 0
            self._holds[program] = (best.tokens, self._clock() + ttl_s)
            return reuse

    def release(self, program: str) -> None:
        with self._lock:
            self._holds.pop(program, None)

    def holders(self) -> frozenset[str]:
        """Programs whose hold is in force."""
        with self._lock:
            self._expire()
            return frozenset(self._holds)

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return self._bytes_of(self._held_keys())

    def _expire(self) -> None:
        now = self._clock()
        for program in [p for p, (_, until) in self._holds.items() if until <= now]:
            del self._holds[program]

    def _held_keys(self) -> set[Tokens]:
        self._expire()
        return {key for key, _ in self._holds.values()}

    def _bytes_of(self, keys: set[Tokens]) -> int:
        return sum(self._states[k].nbytes for k in keys if k in self._states)
