"""What a `Program` needs of the runtime that made it (`AgentRuntime` is one), and the
features that runtime can switch on: a program depends on this, not on the runtime."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol

from teola_core.agents.admission import ProgramAdmission
from teola_core.agents.tool_cache import ToolResultCache
from teola_core.agents.ttl import ToolDurations
from teola_core.engines.retention import KVRetention
from teola_core.ir.graph import Graph
from teola_core.runtime.base import Runtime


@dataclass(frozen=True)
class AgentFeatures:
    """What the agent runtime does beyond running the calls (all on by default)."""

    kv_retention: bool = True
    priority: bool = True
    tool_cache: bool = True
    compaction: bool = True
    admission: bool = True

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def none(cls) -> AgentFeatures:
        return cls(**dict.fromkeys(cls.names(), False))

    @classmethod
    def only(cls, name: str) -> AgentFeatures:
        if name not in cls.names():
            raise ValueError(f"unknown agent feature {name!r} (known: {', '.join(cls.names())})")
        return replace(cls.none(), **{name: True})


class ProgramHost(Protocol):
    """The runtime a program runs its calls on, and the shared state it reads and updates."""

    features: AgentFeatures
    priority_rule: str
    clock: Callable[[], float]
    runtime: Runtime
    durations: ToolDurations
    tool_cache: ToolResultCache

    def optimize(self, frontier: Graph) -> Graph: ...

    def retention(self, engine: str | None) -> KVRetention | None: ...

    def admission(self, engine: str) -> ProgramAdmission | None: ...

    def count_tokens(self, engine: str, prompt: Any) -> int | None: ...

    def discard_private_kv(self, program: Any) -> None: ...

    def next_call_rank(self) -> int: ...

    def queue_delay_s(self) -> float: ...

    def forget(self, program: Any) -> None: ...
