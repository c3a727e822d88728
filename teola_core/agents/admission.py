"""Which agent programs may call the model now: the oldest whose contexts fit the KV pool.

When more agents run than an engine's KV pool can hold, an agent coming back from a tool
finds its context evicted by the others and computes it again, evicting the next one's:
the pool thrashes (Denning's working sets, with KV for pages). A ReAct agent's working
set is its whole context, and it needs it every turn. So the runtime lets a program
call the model only while it is among the oldest programs (by start, the order
Continuum schedules programs in) whose contexts, summed, fit `overcommit` times the
pool. The others wait before their next call, never inside one, and go in as older
programs finish or shrink (compaction). The oldest program is always admitted, so
the runtime always makes progress, and a program counts only from its first call.

`overcommit` above 1 counts on some admitted programs being away on tools at any
moment (their contexts may then be evicted and recomputed once). The rule is also
work-conserving: while no program is calling the model, the next one in line may make
one call, so a pool sized below the programs' contexts never leaves the engine idle.

    admission = ProgramAdmission(capacity_tokens=450_000)
    admission.set_context("agent3", rank=3, tokens=41_000)
    await admission.enter("agent3")   # returns at once, or when older programs make room
    admission.leave("agent3")          # finished
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class _Entry:
    rank: int  # the program's order of start
    tokens: int
    admitted: bool = False  # its context fits among the older programs'
    waiting: bool = False  # in `call`, not yet let through
    calling: int = 0  # its model calls under way
    go: asyncio.Event = field(default_factory=asyncio.Event)


class ProgramAdmission:
    """The admitted set for one engine's KV pool; see the module docstring."""

    def __init__(self, capacity_tokens: int, *, overcommit: float = 1.0) -> None:
        if capacity_tokens <= 0:
            raise ValueError(f"admission needs a positive KV capacity, got {capacity_tokens} tokens")
        if not overcommit > 0:
            raise ValueError(f"admission overcommit must be positive, got {overcommit}")
        self.limit_tokens = capacity_tokens * overcommit
        self._entries: dict[str, _Entry] = {}

    def set_context(self, program: str, *, rank: int, tokens: int) -> None:
        """The program's context is now `tokens` long (its next call's prompt and answer);
        `rank` orders programs by start (lower: older)."""
        entry = self._entries.get(program)
        if entry is None:
            self._entries[program] = _Entry(rank, tokens)
        else:
            entry.tokens = tokens
        self._settle()

    def may_call(self, program: str) -> bool:
        """Would `call` return at once?"""
        entry = self._entries.get(program)
        return entry is None or entry.go.is_set()

    async def call(self, program: str) -> None:
        """Wait until the program may call the model, and mark it calling until `done`
        (`set_context` first; unknown programs pass)."""
        entry = self._entries.get(program)
        if entry is None:
            return
        entry.waiting = True
        self._settle()  # an idle engine lets it through at once
        try:
            await entry.go.wait()
        except BaseException:
            entry.waiting = False
            self._settle()  # a turn it was given passes on
            raise
        entry.waiting = False
        entry.calling += 1
        self._settle()

    def done(self, program: str) -> None:
        """One of the program's model calls ended."""
        entry = self._entries.get(program)
        if entry is not None and entry.calling:
            entry.calling -= 1
            self._settle()

    def leave(self, program: str) -> None:
        """The program finished: its room goes to the next ones in line."""
        if self._entries.pop(program, None) is not None:
            self._settle()

    def admitted(self) -> list[str]:
        """Programs whose contexts fit, oldest first."""
        return [name for name, e in sorted(self._entries.items(), key=lambda kv: kv[1].rank) if e.admitted]

    def _settle(self) -> None:
        total, room = 0, True
        ordered = sorted(self._entries.values(), key=lambda e: e.rank)
        for entry in ordered:
            total += entry.tokens
            room = room and (total <= self.limit_tokens or total == entry.tokens)  # the oldest always
            entry.admitted = room
        # Work-conserving: while no program uses the engine, the next in line may, one at a time.
        idle = not any(e.calling or (e.waiting and e.go.is_set()) for e in ordered)
        for entry in ordered:
            if entry.admitted or entry.calling or (entry.waiting and entry.go.is_set()):
                entry.go.set()
            elif idle and entry.waiting:
                entry.go.set()
                idle = False
            else:
                entry.go.clear()
