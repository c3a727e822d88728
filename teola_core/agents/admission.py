"""Which agent programs may call the model now: the first in line whose contexts fit the KV pool.

When more agents run than an engine's KV pool can hold, an agent coming back from a tool
finds its context evicted by the others and computes it again, evicting the next one's:
the pool thrashes (Denning's working sets, with KV for pages). A ReAct agent's working
set is its whole context, and it needs it every turn. So the runtime lets a program
call the model only while it is among the oldest programs (by start, the order
Continuum schedules programs in) whose contexts, summed, fit `overcommit` times the
pool. The others wait before their next call, never inside one, and go in as older
programs finish or shrink (compaction). The first program in line is always admitted,
so the runtime always makes progress, and a program counts only from its first call.

`overcommit` above 1 counts on some admitted programs being away on tools at any
moment (their contexts may then be evicted and recomputed once). The rule is also
work-conserving: while no program is calling the model, the next one in line may make
one call, so a pool sized below the programs' contexts never leaves the engine idle.

    admission = ProgramAdmission(capacity_tokens=450_000)
    admission.set_context("agent3", rank=3, tokens=41_000)
    await admission.call("agent3")    # returns at once, or when older programs make room
    admission.done("agent3"); admission.leave("agent3")

The order of the line is the programs' start by default. `order="attained"` lines them
up by model calls made instead, in doubling levels (0, 1, 2-3, 4-7, ... calls started;
the oldest first within a level), as Autellix's least-attained-service queues, and any
program whose context fits the room left is admitted even where one ahead of it did
not fit: short programs then finish first while long ones wait. A program's level moves
as its call starts, and if that puts it out of the room its place passes on at once: its
call runs to its end (never stopped), the next program's prompt waits at the server only
until then, and the moved program's context is the one to be evicted anyway. Measured on
the simulated server, this gave 1.66x, 1.37x and 1.65x where keeping a calling program's
room until its call ended gave 1.50x and 1.28x (seeds 0 and 1, `docs/benchmarks.md`). A
long program held back loses its cached context and has it computed again when it goes
on, so which order pays depends on the server's costs (`teola_core.agents.admission_order`
chooses from them). As in Autellix without its starvation guard, a long program held back
waits while shorter ones keep coming; only an idle engine lets it through before they end.

The rule itself is `AdmissionRule`, a pure state machine (stimuli in, who may call out),
tested without an event loop; `ProgramAdmission` mirrors its decisions into one
`asyncio.Event` per program.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal, get_args

AdmissionOrder = Literal["start", "attained"]
ADMISSION_ORDERS: tuple[str, ...] = get_args(AdmissionOrder)


@dataclass
class _Entry:
    rank: int  # the program's order of start
    tokens: int
    admitted: bool = False  # its context fits beside those ahead of it in line
    waiting: bool = False  # asking to call, not yet let through
    calling: int = 0  # its model calls under way
    go: bool = False  # may call now
    calls: int = 0  # model calls it has started (its attained service)

    def key(self, order: AdmissionOrder) -> tuple[int, int]:
        """Its place in line: by start, or by calls made in doubling levels, then start."""
        return (self.calls.bit_length() if order == "attained" else 0, self.rank)


class AdmissionRule:
    """Who may call the model now (see the module docstring), as a pure state machine: each
    stimulus updates the programs' `go` flags; `may_call` reads them."""

    def __init__(self, capacity_tokens: int, *, overcommit: float = 1.0, order: AdmissionOrder = "start") -> None:
        if capacity_tokens <= 0:
            raise ValueError(f"admission needs a positive KV capacity, got {capacity_tokens} tokens")
        if not overcommit > 0:
            raise ValueError(f"admission overcommit must be positive, got {overcommit}")
        self.limit_tokens = capacity_tokens * overcommit
        self.entries: dict[str, _Entry] = {}
        self.order: AdmissionOrder = "start"
        self.set_order(order)

    def set_order(self, order: AdmissionOrder) -> None:
        """Line programs up by start or by attained calls (see the module docstring)."""
        if order not in ADMISSION_ORDERS:
            raise ValueError(f"admission order must be one of {ADMISSION_ORDERS}, got {order!r}")
        if order != self.order:
            self.order = order
            self._settle()

    def set_context(self, program: str, *, rank: int, tokens: int) -> None:
        """The program's context is now `tokens` long (its next call's prompt and answer);
        `rank` orders programs by start (lower: older)."""
        entry = self.entries.get(program)
        if entry is None:
            self.entries[program] = _Entry(rank, tokens)
        else:
            entry.tokens = tokens
        self._settle()

    def may_call(self, program: str) -> bool:
        """May the program call now (unknown programs always may)?"""
        entry = self.entries.get(program)
        return entry is None or entry.go

    def ask(self, program: str) -> None:
        """The program wants to call (an idle engine lets it through at once)."""
        self.entries[program].waiting = True
        self._settle()

    def give_up(self, program: str) -> None:
        """The program stopped waiting (cancelled): a turn it was given passes on."""
        entry = self.entries.get(program)
        if entry is not None:
            entry.waiting = False
            self._settle()

    def start(self, program: str) -> None:
        """The program was let through: its call is under way until `done`."""
        entry = self.entries[program]
        entry.waiting = False
        entry.calling += 1
        entry.calls += 1
        self._settle()

    def done(self, program: str) -> None:
        """One of the program's model calls ended."""
        entry = self.entries.get(program)
        if entry is not None and entry.calling:
            entry.calling -= 1
            self._settle()

    def leave(self, program: str) -> None:
        """The program finished: its room goes to the next ones in line."""
        if self.entries.pop(program, None) is not None:
            self._settle()

    def admitted(self) -> list[str]:
        """Programs whose contexts fit, in line order."""
        return [name for name, e in sorted(self.entries.items(), key=lambda kv: kv[1].key(self.order)) if e.admitted]

    def _settle(self) -> None:
        ordered = sorted(self.entries.values(), key=lambda e: e.key(self.order))
        if self.order == "start":
            total, room = 0, True
            for entry in ordered:
                total += entry.tokens
                room = room and (total <= self.limit_tokens or total == entry.tokens)  # the oldest always
                entry.admitted = room  # nobody overtakes an older program that does not fit
        else:
            total = 0  # whoever fits the room left goes in, in line order; the first always
            for entry in ordered:
                entry.admitted = total + entry.tokens <= self.limit_tokens or total == 0
                if entry.admitted:
                    total += entry.tokens
        # Work-conserving: while no program uses the engine, the next in line may, one at a time.
        idle = not any(e.calling or (e.waiting and e.go) for e in ordered)
        for entry in ordered:
            if entry.admitted or entry.calling or (entry.waiting and entry.go):
                entry.go = True
            elif idle and entry.waiting:
                entry.go = True
                idle = False
            else:
                entry.go = False


class ProgramAdmission:
    """The admitted set for one engine's KV pool: `AdmissionRule`, whose decisions wake the
    programs waiting in `call` (one `asyncio.Event` per program, mirroring its flag)."""

    def __init__(self, capacity_tokens: int, *, overcommit: float = 1.0, order: AdmissionOrder = "start") -> None:
        self.rule = AdmissionRule(capacity_tokens, overcommit=overcommit, order=order)
        self._events: dict[str, asyncio.Event] = {}

    def set_order(self, order: AdmissionOrder) -> None:
        """See `AdmissionRule.set_order`."""
        self.rule.set_order(order)
        self._mirror()

    @property
    def limit_tokens(self) -> float:
        return self.rule.limit_tokens

    def set_context(self, program: str, *, rank: int, tokens: int) -> None:
        """See `AdmissionRule.set_context`."""
        self.rule.set_context(program, rank=rank, tokens=tokens)
        self._mirror()

    def may_call(self, program: str) -> bool:
        """Would `call` return at once?"""
        return self.rule.may_call(program)

    async def call(self, program: str) -> None:
        """Wait until the program may call the model, and mark it calling until `done`
        (`set_context` first; unknown programs pass)."""
        if program not in self.rule.entries:
            return
        self.rule.ask(program)
        self._mirror()
        try:
            await self._events[program].wait()
        except BaseException:
            self.rule.give_up(program)
            self._mirror()
            raise
        self.rule.start(program)
        self._mirror()

    def done(self, program: str) -> None:
        """One of the program's model calls ended."""
        self.rule.done(program)
        self._mirror()

    def leave(self, program: str) -> None:
        """The program finished: its room goes to the next ones in line."""
        self.rule.leave(program)
        self._mirror()

    def admitted(self) -> list[str]:
        """Programs whose contexts fit, in line order."""
        return self.rule.admitted()

    def _mirror(self) -> None:
        """Each program's event follows its `go` flag; a program that left has none."""
        for program in set(self._events) - set(self.rule.entries):
            del self._events[program]
        for program, entry in self.rule.entries.items():
            event = self._events.setdefault(program, asyncio.Event())
            if entry.go:
                event.set()
            else:
                event.clear()
