"""Per-query state that LangChain steps need but a graph does not carry: their config.

A traced graph is built once and shared by every query, so what differs per query —
the `RunnableConfig` (callbacks, tags, metadata, configurable, ...) and whether the
caller used a sync or an async method — travels beside the data:

- user steps (`call` and condition nodes) get the `QueryContext` on a graph input
  named "context", like any other value;
- engines get a `Call` whose `query_id` they look up in the `ContextRegistry` that the
  optimized runnable shares with them (passes rewrite engine nodes freely, so an extra
  port there would not survive; the query id always does).

Each step runs with `merge_configs(*bound, query.config)`: `bound` are the configs of
the `RunnableBinding`s (`with_config`) around the step, innermost first, exactly the
precedence `RunnableBinding._merge_configs` gives when LangChain nests them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING
from uuid import uuid4

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import merge_configs

if TYPE_CHECKING:
    from teola_core.runtime.base import Runtime


BoundConfigs = tuple[RunnableConfig, ...]


@dataclass(frozen=True)
class QueryContext:
    """One query's config and mode, and the runtime it runs on (for nested graphs).

    sync: the caller used invoke/batch/stream, so user steps take their sync path in a
    worker thread (`step.invoke`), as LangChain's sync methods do; otherwise `ainvoke`.
    """

    query_id: str
    config: RunnableConfig
    sync: bool
    runtime: Runtime
    registry: ContextRegistry = field(repr=False, compare=False)

    def step_config(self, bound: Sequence[RunnableConfig] = ()) -> RunnableConfig:
        """A fresh config for one step (steps may mutate what they are given)."""
        if bound:
            return merge_configs(*bound, self.config)
        return RunnableConfig(**self.config)

    def child(self, config: RunnableConfig | None = None) -> QueryContext:
        """A context for a nested query (one element of a map), with its own id."""
        return replace(self, query_id=f"{self.query_id}/{uuid4().hex[:12]}", config=config or self.config)


class ContextRegistry:
    """Query id -> context, shared by one optimized runnable and its engines."""

    def __init__(self) -> None:
        self._contexts: dict[str, QueryContext] = {}

    def __getitem__(self, query_id: str) -> QueryContext:
        try:
            return self._contexts[query_id]
        except KeyError:
            raise KeyError(
                f"no running query {query_id!r}: engines of an optimized runnable serve only its queries"
            ) from None

    @contextmanager
    def registered(self, ctx: QueryContext) -> Iterator[QueryContext]:
        if ctx.query_id in self._contexts:
            raise ValueError(f"query id {ctx.query_id!r} is already running")
        self._contexts[ctx.query_id] = ctx
        try:
            yield ctx
        finally:
            del self._contexts[ctx.query_id]

    def __len__(self) -> int:
        return len(self._contexts)
