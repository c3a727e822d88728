"""The simulated LLM's prefix cache: whole blocks of tokens, LRU, with holds (see `PrefixCache`)."""

from __future__ import annotations

import hashlib
import heapq
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count

BLOCK_TOKENS = 16


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
