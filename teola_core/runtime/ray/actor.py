"""What runs inside an engine's Ray actor, and what the driver learns of it.

`EngineActor` builds one engine from a pickled factory and runs its batches and streams;
`ActorInfo` says which actor (and node) that is; the errors name both when an actor is
lost. Ray is imported only when needed (`require_ray`), so `teola_core` imports without it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from types import ModuleType

from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits
from teola_core.ir.kinds import PrimitiveKind
from teola_core.profiles.profile import LatencyProfile


def require_ray() -> ModuleType:
    """Import Ray, or fail naming the extra that installs it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            f"the Ray backend needs the `ray` package, which is not installed ({exc}). "
            'Install it with: pip install "teola[ray]"'
        ) from exc
    return ray


class EngineActorError(RuntimeError):
    """An engine's Ray actor was lost while it ran these calls (they could not be re-sent)."""

    def __init__(self, message: str, *, engine: str, actor: ActorInfo) -> None:
        super().__init__(message)
        self.engine = engine
        self.actor = actor


class EngineUnavailableError(RuntimeError):
    """No replica of an engine can take a call: none can be placed, none started in time, or closed."""

    def __init__(self, message: str, *, engine: str, final: bool = False) -> None:
        super().__init__(message)
        self.engine = engine
        self.final = final  # no replica can come back (closed, failed to start, or restarts used up)


@dataclass(frozen=True)
class ActorInfo:
    """One actor serving a pool slot: Ray actor id, worker pid, and the node it runs on."""

    slot: int
    actor_id: str
    pid: int
    node_id: str
    node_ip: str

    def describe(self, replicas: int) -> str:
        return (
            f"replica {self.slot + 1} of {replicas} (Ray actor {self.actor_id}, pid {self.pid}, "
            f"node {self.node_id[:12]} at {self.node_ip})"
        )


@dataclass(frozen=True)
class EngineDescription:
    """What the driver needs of an engine that runs elsewhere."""

    name: str
    kinds: frozenset[PrimitiveKind]
    limits: EngineLimits
    profile: LatencyProfile | None

    @classmethod
    def of(cls, engine: Engine, name: str | None = None) -> EngineDescription:
        return cls(name or engine.name, frozenset(engine.kinds), engine.limits, engine.profile)


class EngineCopy:
    """A factory returning the engine object it was built with: every actor unpickles its own copy.

    For engines that pickle (simulated engines, HTTP clients before first use); engines
    holding a loaded model or an open connection need a factory that builds them.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def __call__(self) -> Engine:
        return self.engine

    def __repr__(self) -> str:
        return f"EngineCopy({self.engine.name!r})"


class EngineActor:
    """The actor body (made remote by `RayEnginePool`): one engine instance, built in the actor."""

    def __init__(self, factory: bytes, slot: int) -> None:
        self._engine: Engine = require_ray().cloudpickle.loads(factory)()
        self._slot = slot

    async def whoami(self) -> ActorInfo:
        ray = require_ray()
        context = ray.get_runtime_context()
        return ActorInfo(
            self._slot, context.get_actor_id() or "", os.getpid(), context.get_node_id(), ray.util.get_node_ip_address()
        )

    async def describe(self) -> tuple[EngineDescription, ActorInfo]:
        return EngineDescription.of(self._engine), await self.whoami()

    async def watch(self) -> None:
        """Never returns: the driver awaits it to learn of this actor's death as an event."""
        await asyncio.Event().wait()

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        return list(await self._engine.run(calls))

    async def stream(self, call: Call) -> AsyncIterator[str]:
        async for delta in self._engine.stream(call):
            yield delta

    async def close(self) -> None:
        await self._engine.close()


NOBODY = ActorInfo(-1, "?", 0, "?", "?")  # for errors about an actor never seen ready


def engine_error(exc: BaseException) -> BaseException:
    """The engine's own exception inside a Ray task error (so errors read as on the local backend)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc
