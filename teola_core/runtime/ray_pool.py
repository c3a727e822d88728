"""`RayEnginePool`: one engine served by N Ray actors, behind the ordinary `Engine` protocol.

Engines hold models and connections, which do not travel: each actor builds its own
engine from a picklable *factory* (`EngineCopy(engine)` ships a copy of an engine object
that pickles). The engine schedulers stay in the driver (`RayRuntime` is the local
runtime driving pools), so batching still spans every query; a pool only decides which
actor runs a batch and carries results back. Nothing polls: ObjectRefs are awaitable and
streams are Ray streaming generators whose deltas are yielded as they arrive.

    pool = RayEnginePool(EngineCopy(SimLLM(profile, time_scale=0)), instances=2, num_cpus=1)
    [out] = await pool.run([call])          # on the least-loaded live actor
    async for delta in pool.stream(call):   # decode deltas as the actor produces them
        ...
    await pool.close()                      # closes each engine, then kills the actors

Routing: a batch goes to the least-loaded actor (calls in flight; ties rotate, so
sequential batches still spread). A call whose input is a `KVHandle` this pool produced
goes to the actor that produced it, since decode must run where the prefill ran: the
pool tags each handle's engine-private token with its slot on the way out and unwraps it
on the way in (a batch that mixes handles of several actors is split per actor).

Limits: `concurrency` = instances x per-actor concurrency (default: the engine's own
`limits.concurrency`); `instances` = instances x the engine's own `limits.instances`
(an actor may itself stand for several model instances, e.g. `SimLLM(instances=2)`).
The scheduler enforces the total; least-loaded routing keeps each actor within its share.

Failures: an exception raised by the engine (in `run` or `stream`) reaches the runtime
as the original exception, so errors read as on the local backend. An actor that dies
(or is restarted) fails only the calls it had in flight, with `EngineActorError` naming
the engine, the actor and its pid; Ray restarts it (`max_restarts`, default unlimited)
and the next calls run on the new incarnation. A slot whose actor is dead for good (no
restarts left) gets a fresh actor from the factory.

State: each actor has its own engine state. An engine whose calls read state that
earlier calls wrote (an in-process vector store's collections) must run as one instance,
or keep that state outside the process (pgvector).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits, EngineSet
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.types import KVHandle
from teola_core.profiles.profile import LatencyProfile
from teola_core.runtime.ray import require_ray

EngineFactory = Callable[[], Engine]


def _ray() -> ModuleType:
    return require_ray()


class EngineActorError(RuntimeError):
    """An engine's actor died while it held these calls: they failed, other calls did not."""


@dataclass(frozen=True)
class ActorInfo:
    """Which actor serves a pool slot: its Ray actor id and its worker process's pid."""

    slot: int
    actor_id: str
    pid: int


@dataclass(frozen=True)
class _Description:
    """What the driver needs of an engine it never builds itself."""

    name: str
    kinds: frozenset[PrimitiveKind]
    limits: EngineLimits
    profile: LatencyProfile | None
    info: ActorInfo


@dataclass(frozen=True)
class _Pinned:
    """A KV handle's engine-private token, tagged with the pool and slot that hold its state."""

    pool: str
    slot: int
    token: Any


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


class _EngineActor:
    """The actor body (made remote by the pool): one engine instance, built in the actor."""

    def __init__(self, factory: EngineFactory, slot: int) -> None:
        self._engine = factory()
        self._slot = slot

    async def whoami(self) -> ActorInfo:
        return ActorInfo(self._slot, _ray().get_runtime_context().get_actor_id(), os.getpid())

    async def describe(self) -> _Description:
        e = self._engine
        return _Description(e.name, frozenset(e.kinds), e.limits, e.profile, await self.whoami())

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        return list(await self._engine.run(calls))

    async def stream(self, call: Call) -> AsyncIterator[str]:
        async for delta in self._engine.stream(call):
            yield delta

    async def close(self) -> None:
        await self._engine.close()


class RayEnginePool(Engine):
    """An engine served by `instances` Ray actors, each building its engine from `factory`.

    num_cpus / num_gpus / resources: what each actor reserves (Ray places it where they
    are free). concurrency: batches one actor runs at once (default: the engine's own
    `limits.concurrency`). max_restarts: Ray restarts of a dead actor (-1: unlimited).
    name: the pool's engine name (default: the engine's). actor_options: any other
    `ray.remote` actor option. Construction blocks until every actor has built its
    engine (use `await RayEnginePool.create(...)` inside an event loop).
    """

    def __init__(
        self,
        factory: EngineFactory,
        *,
        instances: int = 1,
        concurrency: int | None = None,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        resources: Mapping[str, float] | None = None,
        max_restarts: int = -1,
        name: str | None = None,
        actor_options: Mapping[str, Any] | None = None,
    ) -> None:
        if instances < 1:
            raise ValueError(f"a pool needs at least one instance, got {instances}")
        ray = self._ray = _ray()
        options: dict[str, Any] = {"max_restarts": max_restarts, "max_task_retries": 0}
        for key, value in (("num_cpus", num_cpus), ("num_gpus", num_gpus), ("resources", resources)):
            if value is not None:
                options[key] = dict(value) if isinstance(value, Mapping) else value
        options.update(actor_options or {})
        self._factory = factory
        self._factory_ref = ray.put(factory)  # held: restarts rebuild the engine from it
        self._actor_class = ray.remote(_EngineActor).options(**options)
        self._id = uuid.uuid4().hex
        self._actors = [self._actor_class.remote(self._factory_ref, slot) for slot in range(instances)]
        try:
            described: list[_Description] = ray.get([a.describe.remote() for a in self._actors])
        except Exception as exc:
            for actor in self._actors:
                ray.kill(actor, no_restart=True)
            raise RuntimeError(f"engine factory {factory!r} failed in its Ray actor: {exc}") from exc
        first = described[0]
        self.name = name or first.name
        self.kinds = first.kinds
        self.profile = first.profile
        per_actor = concurrency if concurrency is not None else first.limits.concurrency
        self.limits = dataclasses.replace(
            first.limits, concurrency=instances * per_actor, instances=instances * first.limits.instances
        )
        self._infos = [d.info for d in described]
        self._load = [0] * instances  # calls in flight per slot
        self.served = [0] * instances  # calls each slot has run (for tests and metrics)
        self._cursor = 0
        self._closed = False

    @classmethod
    async def create(cls, factory: EngineFactory, **kwargs: Any) -> RayEnginePool:
        """Build a pool without blocking the running event loop while the actors start."""
        return await asyncio.to_thread(cls, factory, **kwargs)

    # -- inspection ------------------------------------------------------------------------
    @property
    def actors(self) -> tuple[Any, ...]:
        """The actor handles, by slot."""
        return tuple(self._actors)

    @property
    def infos(self) -> tuple[ActorInfo, ...]:
        """What the pool last learned of each slot's actor (pids change on restart)."""
        return tuple(self._infos)

    async def refresh(self) -> tuple[ActorInfo, ...]:
        """Ask every actor who it is now (waits for restarting actors)."""
        self._infos = list(await asyncio.gather(*(a.whoami.remote() for a in self._actors)))
        return self.infos

    # -- the protocol ----------------------------------------------------------------------
    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        prepared: list[Call] = []
        groups: dict[int, list[int]] = {}
        free: list[int] = []
        for i, call in enumerate(calls):
            slot, call = self._unpin(call)
            prepared.append(call)
            (free if slot is None else groups.setdefault(slot, [])).append(i)
        if free:
            groups.setdefault(self._pick(), []).extend(free)
        for slot, indices in groups.items():
            self._load[slot] += len(indices)
        results: list[CallResult] = [EngineActorError("not run")] * len(calls)
        await asyncio.gather(*(self._run_on(slot, idx, prepared, results) for slot, idx in groups.items()))
        return results

    async def stream(self, call: Call) -> AsyncIterator[str]:
        slot, call = self._unpin(call)
        if slot is None:
            slot = self._pick()
        self._load[slot] += 1
        errors = self._ray.exceptions
        generator = self._actors[slot].stream.options(num_returns="streaming").remote(call)
        finished = False
        try:
            async for ref in generator:
                yield await ref
            finished = True
        except errors.RayActorError as exc:
            error = self._actor_error(slot, 1, exc)
            await self._revive(slot, exc)
            raise error from exc
        except errors.RayTaskError as exc:
            raise _cause(exc) from exc
        finally:
            self._load[slot] -= 1
            self.served[slot] += 1
            if not finished:  # the consumer left, or it failed: stop the actor's generator
                self._ray.cancel(generator)

    async def close(self) -> None:
        """Close each actor's engine, then kill the actors (they are not restarted)."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.gather(*(a.close.remote() for a in self._actors))
        finally:
            for actor in self._actors:
                self._ray.kill(actor, no_restart=True)

    # -- helpers ---------------------------------------------------------------------------
    def _pick(self) -> int:
        """The least-loaded slot; ties rotate so that sequential batches spread too."""
        n = len(self._actors)
        order = [(self._cursor + k) % n for k in range(n)]
        slot = min(order, key=self._load.__getitem__)
        self._cursor = (slot + 1) % n
        return slot

    async def _run_on(self, slot: int, indices: list[int], calls: list[Call], results: list[CallResult]) -> None:
        batch = [calls[i] for i in indices]
        errors = self._ray.exceptions
        ref = self._actors[slot].run.remote(batch)
        out: list[CallResult]
        try:
            out = list(await ref)
            if len(out) != len(batch):
                raise RuntimeError(
                    f"engine {self.name!r} returned {len(out)} results for a batch of {len(batch)} calls"
                )
            out = [self._pin(slot, r) for r in out]
        except asyncio.CancelledError:
            self._ray.cancel(ref)
            raise
        except errors.RayActorError as exc:
            out = [self._actor_error(slot, len(batch), exc)] * len(batch)
            await self._revive(slot, exc)
        except Exception as exc:  # the engine raised: every call of the batch fails with it, as locally
            out = [_cause(exc)] * len(batch)
        finally:
            self._load[slot] -= len(batch)
        self.served[slot] += len(batch)
        for i, result in zip(indices, out, strict=True):
            results[i] = result

    def _actor_error(self, slot: int, n_calls: int, exc: BaseException) -> EngineActorError:
        info = self._infos[slot]
        return EngineActorError(
            f"engine {self.name!r}: its Ray actor {info.actor_id} (instance {slot + 1} of {len(self._actors)}, "
            f"pid {info.pid}) died while running {n_calls} call(s); they failed and the actor is restarted "
            f"({type(exc).__name__})"
        )

    async def _revive(self, slot: int, cause: BaseException) -> None:
        """After an actor failure: learn the restarted actor's identity, or replace a dead one."""
        errors = self._ray.exceptions
        actor = self._actors[slot]
        try:
            self._infos[slot] = await actor.whoami.remote()
        except errors.ActorDiedError:  # no restarts left: a fresh actor takes the slot
            if self._actors[slot] is actor and not self._closed:
                fresh = self._actor_class.remote(self._factory_ref, slot)
                self._actors[slot] = fresh
                self._infos[slot] = await fresh.whoami.remote()

    def _pin(self, slot: int, result: CallResult) -> CallResult:
        if isinstance(result, BaseException) or not isinstance(result, Mapping):
            return result
        if not any(isinstance(v, KVHandle) for v in result.values()):
            return result
        return {
            k: dataclasses.replace(v, token=_Pinned(self._id, slot, v.token)) if isinstance(v, KVHandle) else v
            for k, v in result.items()
        }

    def _unpin(self, call: Call) -> tuple[int | None, Call]:
        """The slot holding this call's KV state (if any), and the call with plain handles."""
        slot: int | None = None
        inputs: dict[str, Any] | None = None
        for port, value in call.inputs.items():
            if isinstance(value, KVHandle) and isinstance(value.token, _Pinned) and value.token.pool == self._id:
                slot = value.token.slot if slot is None else slot
                inputs = dict(call.inputs) if inputs is None else inputs
                inputs[port] = dataclasses.replace(value, token=value.token.token)
        return slot, call if inputs is None else dataclasses.replace(call, inputs=inputs)


def _cause(exc: BaseException) -> BaseException:
    """The engine's own exception inside a Ray task error (so errors read as on the local backend)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def ray_engines(
    engines: EngineSet,
    *,
    instances: int | Mapping[str, int] = 1,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> EngineSet:
    """The same engines, each copied into a `RayEnginePool` (pools given are kept as they are).

    instances: actors per engine (one number, or per engine name; default 1, which is
    what a stateful in-process engine needs). options: per engine name, keyword
    arguments of `RayEnginePool` (num_cpus, num_gpus, resources, concurrency, ...).
    """
    pools = EngineSet()
    for name, engine in engines.engines.items():
        if isinstance(engine, RayEnginePool):
            pools.add(engine, name)
            continue
        n = instances if isinstance(instances, int) else instances.get(name, 1)
        pools.add(RayEnginePool(EngineCopy(engine), instances=n, name=name, **dict((options or {}).get(name, {}))))
    return pools
