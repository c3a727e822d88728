"""What the graphs of one trace share: the engines, the nested graphs, and the notes for explain().

Tracing a chain may build several graphs (a `.map()` body is a graph of its own); they all
register their engines in one `EngineRegistry` and report to one `TraceSession`: the
nested graphs, the steps Teola runs as one call (warned once each with
`OpaqueStepWarning`), the key of every step whose run time the plan uses, and where an
optimization is blocked. `tracer.trace_in(session, chain)` walks a chain in a session.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from itertools import count
from typing import Any

from langchain_core.runnables import Runnable

from teola_langchain.engines import EngineRegistry
from teola_langchain.tracing.advice import StepInfo
from teola_langchain.tracing.traced import Blocked, EarlyNote, SubGraph


class OpaqueStepWarning(UserWarning):
    """A step Teola does not look into runs as one call: same results, no optimization inside."""


class TraceSession:
    """State shared by the graphs of one trace: engines, nested graphs, opaque-step notes."""

    def __init__(
        self,
        engines: EngineRegistry,
        *,
        warn: bool = True,
        expected_items: int | None = None,
        counts: Callable[[str], int | None] | None = None,
    ) -> None:
        self.engines = engines
        self.expected_items = expected_items
        self.counts = counts  # a step key -> how many items it usually outputs (learned)
        self.subgraphs: list[SubGraph] = []
        self.opaque: list[str] = []
        self.steps: dict[str, StepInfo] = {}
        self.blocked: list[Blocked] = []
        self.scopes = count()  # run scope ids, unique across the session's graphs
        self.early: list[EarlyNote] = []  # which steps start early, and why the others wait (explain())
        self._warn = warn
        self._noted: set[int] = set()

    def items_of(self, parser_key: str) -> int | None:
        """How many items the model before the parser `parser_key` is expected to write."""
        if self.expected_items is not None:
            return self.expected_items
        return self.counts(parser_key) if self.counts is not None else None

    def note_opaque(self, step: Runnable[Any, Any], reason: str) -> None:
        if id(step) in self._noted:
            return
        self._noted.add(id(step))
        label = f"{step.get_name()} ({type(step).__name__})"
        self.opaque.append(f"{label}: {reason}")
        if self._warn:
            warnings.warn(
                f"teola: step {label} runs as one call ({reason}); its results are unchanged, "
                "only optimization inside it is lost",
                OpaqueStepWarning,
                stacklevel=5,
            )
