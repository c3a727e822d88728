"""The interface every runtime backend implements (local asyncio, Ray).

A runtime drives the scheduler state machines and does the I/O: it starts engines'
batches, feeds results back as events, and resolves each query's future. Observers
(timelines, metrics) hang on hooks and never change what runs.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from teola_core.ir.graph import Graph
from teola_core.ir.node import Node


@dataclass(frozen=True)
class PrimitiveSpan:
    """One primitive's execution: when it was queued, started and ended (runtime clock)."""

    query_id: str
    node: Node
    ready_at: float
    started_at: float
    ended_at: float
    batch_size: int = 1
    error: str | None = None


class RuntimeHook(Protocol):
    def on_span(self, span: PrimitiveSpan) -> None: ...


def notify(hooks: Sequence[RuntimeHook], span: PrimitiveSpan) -> None:
    """Hand a span to every hook; a failing hook is reported where asyncio reports errors
    (it never stops the query)."""
    for hook in hooks:
        try:
            hook.on_span(span)
        except Exception as exc:
            asyncio.get_running_loop().call_exception_handler(
                {"message": f"runtime hook {hook!r} failed on a span of {span.node.describe()}", "exception": exc}
            )


class Runtime(ABC):
    @abstractmethod
    async def run(
        self,
        graph: Graph,
        inputs: Mapping[str, Any],
        *,
        query_id: str | None = None,
        arrival: float | None = None,
        context: Any = None,
    ) -> dict[str, Any]:
        """Run one query's graph to completion; return the output node's values.

        `context` travels to the engines on every `Call` of the query (`Call.context`).

        `arrival` (runtime clock) orders the query's primitives at the engines as if it
        had arrived then (default: now); the agent runtime gives every call of one agent
        its program's start, so a returning agent goes before agents that came later.
        """

    @abstractmethod
    def add_hook(self, hook: RuntimeHook) -> None:
        """Observe every primitive's span."""

    async def close(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Stop background work. Default: nothing to stop."""
