"""`RayEnginePool`: one engine served by N Ray actors (replicas), behind the ordinary `Engine` protocol.

Engines hold models and connections, which do not travel: each actor builds its own
engine from a picklable *factory* (`EngineCopy(engine)` ships a copy of an engine object
that pickles). The engine schedulers stay in the driver (`RayRuntime`), so batching still
spans every query; a pool only picks the replica that runs a batch and carries results
back. One pool may serve several event loops (a drop-in's sync thread and its async
callers): its state is guarded by a lock and results arrive as Ray futures.

    pool = await RayEnginePool.create(VLLMLocalFactory(model), instances=2, num_gpus=1)
    [out] = await pool.run([call])          # on the least-loaded ready replica
    async for delta in pool.stream(call):   # decode deltas as the actor produces them
        ...
    await pool.close()                      # closes each engine, then kills the actors

Routing: a batch goes to the least-loaded *ready* replica (ties rotate); a decode whose
KV handle this pool produced goes to the actor that holds its state (the pool tags each
handle with it: `kv_pins`). Replicas that are lost are replaced (`replicas`).

A call that was running on a lost actor is re-sent once to another replica (engine calls
are stateless), except a call whose KV state lived there, an INGEST (a write may have
happened) and a stream that had already yielded: those fail with `EngineActorError`
naming the engine and the actor (id, pid, node). Errors raised by the engine itself reach
the runtime as the original exception, as on the local backend. Each replica has its own
engine state: an engine whose calls read what earlier calls wrote needs one replica.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from teola_core.engines.protocol import Call, CallResult, Engine
from teola_core.ir.kinds import PrimitiveKind
from teola_core.runtime.ray.actor import (
    NOBODY,
    ActorInfo,
    EngineActor,
    EngineActorError,
    EngineCopy,
    EngineDescription,
    EngineUnavailableError,
    engine_error,
    require_ray,
)
from teola_core.runtime.ray.kv_pins import PinnedToken, pin_kv_handles, unpin_call
from teola_core.runtime.ray.options import DEFAULT_REPLICA_WAIT_S, EngineOptions
from teola_core.runtime.ray.replica_state import Incarnation
from teola_core.runtime.ray.replicas import Replicas

__all__ = [
    "ActorInfo",
    "EngineActorError",
    "EngineCopy",
    "EngineDescription",
    "EngineUnavailableError",
    "RayEnginePool",
]

EngineFactory = Callable[[], Engine]

# Calls that are not re-sent after their actor was lost: a write may already have happened.
_NOT_RETRIED = frozenset({PrimitiveKind.INGEST})


class RayEnginePool(Engine):
    """An engine served by `instances` Ray actors, each building its engine from `factory`.

    num_cpus / num_gpus / memory / resources: what each actor reserves (Ray places it
    where they are). concurrency: batches one replica runs at once (default: the engine's
    own `limits.concurrency`). max_restarts: replacements of a lost replica (-1:
    unlimited). replica_wait_s: how long a call waits for a replica to (re)start. name:
    the pool's engine name (default: the engine's). actor_options: any other
    `ray.remote` actor option. description: the engine's name, kinds, limits and profile
    when the driver knows them (a copy of a local engine): the pool then starts without
    waiting for its actors (`start=False`: later, by `start()`). Without it, construction
    blocks until every actor has built its engine: use `await RayEnginePool.create(...)`
    inside an event loop.
    """

    def __init__(
        self,
        factory: EngineFactory,
        *,
        instances: int = 1,
        concurrency: int | None = None,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        memory: float | None = None,
        resources: Mapping[str, float] | None = None,
        max_restarts: int = -1,
        replica_wait_s: float = DEFAULT_REPLICA_WAIT_S,
        name: str | None = None,
        actor_options: Mapping[str, Any] | None = None,
        description: EngineDescription | None = None,
        start: bool = True,
    ) -> None:
        fields = {"num_replicas": instances, "concurrency": concurrency, "num_cpus": num_cpus, "num_gpus": num_gpus}
        fields |= {"memory": memory, "resources": resources or {}, "max_restarts": max_restarts}
        fields |= {"replica_wait_s": replica_wait_s, "actor_options": actor_options or {}}
        self.options = EngineOptions(**EngineOptions.parse(fields, f"RayEnginePool({factory!r})"))
        ray = self._ray = require_ray()
        what = name or (description.name if description else repr(factory))
        try:
            factory_blob = ray.cloudpickle.dumps(factory)  # kept: every replacement is built from it
        except Exception as exc:
            raise TypeError(
                f"engine {what!r} cannot be sent to a Ray actor: {factory!r} does not pickle ({exc}). Run it in "
                f"the driver (ray={{'engines': {{{what!r}: {{'in_driver': True}}}}}}) or give a RayEnginePool a "
                "factory that builds it inside the actor"
            ) from exc
        actor = {"max_restarts": 0, "max_task_retries": 0}  # the pool replaces lost actors itself
        for key in ("num_cpus", "num_gpus", "memory"):
            if getattr(self.options, key) is not None:
                actor[key] = getattr(self.options, key)
        if self.options.resources:
            actor["resources"] = dict(self.options.resources)
        actor |= {k: v for k, v in self.options.actor_options.items() if k not in ("max_restarts", "max_task_retries")}
        self._id = uuid.uuid4().hex
        self._replicas = Replicas(factory_blob, ray.remote(EngineActor).options(**actor), self.options, what)
        if description is None:
            self._replicas.start_and_wait(f"engine factory {factory!r}")
            description = self._replicas.description
            assert description is not None
        elif start:
            self._replicas.start()
        self.name = self._replicas.name = name or description.name
        self.kinds = description.kinds
        self.profile = description.profile
        per_actor = concurrency if concurrency is not None else description.limits.concurrency
        self.limits = dataclasses.replace(
            description.limits, concurrency=instances * per_actor, instances=instances * description.limits.instances
        )

    @classmethod
    async def create(cls, factory: EngineFactory, **kwargs: Any) -> RayEnginePool:
        """Build a pool without blocking the running event loop while the actors start."""
        return await asyncio.to_thread(cls, factory, **kwargs)

    @classmethod
    def copy_of(
        cls, engine: Engine, options: EngineOptions, *, name: str | None = None, start: bool = True
    ) -> RayEnginePool:
        """A pool of copies of `engine` (it must pickle), placed as `options` say; starts without waiting."""
        o = options
        return cls(
            EngineCopy(engine),
            instances=o.num_replicas,
            concurrency=o.concurrency,
            num_cpus=o.num_cpus,
            num_gpus=o.num_gpus,
            memory=o.memory,
            resources=o.resources,
            max_restarts=o.max_restarts,
            replica_wait_s=o.replica_wait_s,
            name=name,
            actor_options=o.actor_options,
            description=EngineDescription.of(engine, name),
            start=start,
        )

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the replicas' actors (Ray must be connected); returns at once."""
        self._replicas.start()

    def fail(self, error: BaseException) -> None:
        """The pool cannot start (e.g. Ray did not connect): calls fail with `error` as the cause."""
        self._replicas.fail(error)

    async def wait_ready(self) -> None:
        """Wait until every replica is ready (at most `replica_wait_s`); fail if one cannot start."""
        await self._replicas.wait_ready()

    async def close(self) -> None:
        """Close each ready replica's engine, then kill every actor (none is replaced)."""
        incarnations = self._replicas.shut()
        errors = self._ray.exceptions
        try:
            ready = [i for i in incarnations if i.info is not None]
            results = await asyncio.gather(*(i.actor.close.remote() for i in ready), return_exceptions=True)
            failures = [r for r in results if isinstance(r, BaseException) and not isinstance(r, errors.RayActorError)]
            if failures:
                raise engine_error(failures[0])
        finally:
            self._replicas.kill(incarnations)

    def kill(self) -> None:
        """Kill every actor without closing the engines (for synchronous owners and finalizers)."""
        self._replicas.kill(self._replicas.shut())

    # -- inspection ------------------------------------------------------------------------
    @property
    def actors(self) -> tuple[Any, ...]:
        """The current actor handle of each slot (None while a slot has none)."""
        return self._replicas.actors

    @property
    def infos(self) -> tuple[ActorInfo | None, ...]:
        """Per slot, the latest actor that was ready (its id, pid and node)."""
        return self._replicas.infos

    @property
    def states(self) -> tuple[str, ...]:
        """Per slot: "idle", "starting", "ready", "lost" or "closed"."""
        return self._replicas.states

    @property
    def served(self) -> tuple[int, ...]:
        """Calls each slot has run (all its incarnations)."""
        return self._replicas.served

    @property
    def resent(self) -> int:
        """Calls re-sent to another replica after their actor was lost."""
        return self._replicas.resent

    async def refresh(self) -> tuple[ActorInfo | None, ...]:
        """Ask every ready actor who it is now."""
        actors = [a for a in self.actors if a is not None]
        await asyncio.gather(*(a.whoami.remote() for a in actors))
        return self.infos

    # -- the protocol ----------------------------------------------------------------------
    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        results: list[Any] = [None] * len(calls)
        wire: list[Call] = []
        groups: dict[tuple[Incarnation | None, bool], list[int]] = {}
        for i, call in enumerate(calls):
            pin, plain = unpin_call(self._id, call)
            wire.append(plain)
            holder = self._holder(pin)
            if pin is not None and pin.token is not None and holder is None:
                results[i] = self._kv_lost(pin)
                continue
            movable = (pin is None or pin.token is None) and call.node.kind not in _NOT_RETRIED
            groups.setdefault((holder, movable), []).append(i)

        async def run_group(holder: Incarnation | None, movable: bool, indices: list[int]) -> None:
            batch = [wire[i] for i in indices]
            try:
                out = await self._run_batch(holder, movable, batch)
            except EngineUnavailableError as exc:
                out = [exc] * len(batch)
            for i, result in zip(indices, out, strict=True):
                results[i] = result

        await asyncio.gather(*(run_group(h, m, idx) for (h, m), idx in groups.items()))
        return results

    async def stream(self, call: Call) -> AsyncIterator[str]:
        pin, plain = unpin_call(self._id, call)
        holder = self._holder(pin)
        if pin is not None and pin.token is not None and holder is None:
            raise self._kv_lost(pin)
        movable = pin is None or pin.token is None
        errors = self._ray.exceptions
        lease = await self._replicas.lease(holder, 1)
        for attempt in (1, 2):
            generator = lease.actor.stream.options(num_returns="streaming").remote(plain)
            yielded = finished = False
            try:
                async for ref in generator:
                    delta = await ref
                    yielded = True
                    yield delta
                finished = True
                return
            except errors.RayActorError as exc:
                self._replicas.report_lost(lease, exc)
                if yielded or not movable or attempt == 2:
                    why = "after its first deltas" if yielded else _why_not_resent(movable)
                    raise self._lost_error(lease, 1, exc, why) from exc
                lost: BaseException = exc
            except errors.RayTaskError as exc:
                raise engine_error(exc) from exc
            finally:
                self._replicas.release(lease, 1, done=finished or yielded)
                if not finished:
                    self._ray.cancel(generator)
            lease = await self._lease_after_loss(lease, 1, lost)

    # -- running a batch -------------------------------------------------------------------
    async def _run_batch(self, holder: Incarnation | None, movable: bool, batch: list[Call]) -> list[CallResult]:
        """Run on the holder (or any ready replica); re-send once if `movable` and the actor was lost."""
        lease = first = await self._replicas.lease(holder, len(batch))
        for attempt in (1, 2):
            try:
                return await self._call(lease, batch)
            except _ActorLost as lost:
                if not movable or attempt == 2:
                    errors = [self._lost_error(lease, len(batch), lost.cause, _why_not_resent(movable)) for _ in batch]
                    if attempt == 2 and first.info is not None:
                        for error in errors:
                            error.add_note(f"first sent to {first.info.describe(len(self._replicas))}, lost too")
                    return list(errors)
                lease = await self._lease_after_loss(lease, len(batch), lost.cause)
        raise AssertionError("unreachable")

    async def _call(self, lease: Incarnation, batch: list[Call]) -> list[CallResult]:
        ref = lease.actor.run.remote(batch)
        done = False
        try:
            out = list(await asyncio.wrap_future(ref.future()))  # half the latency of `await ref` (measured)
            done = True
        except asyncio.CancelledError:
            self._ray.cancel(ref)
            raise
        except self._ray.exceptions.RayActorError as exc:
            self._replicas.report_lost(lease, exc)
            raise _ActorLost(exc) from exc
        except Exception as exc:  # the engine raised: every call of the batch fails with it, as locally
            done = True
            return [engine_error(exc)] * len(batch)
        finally:
            self._replicas.release(lease, len(batch), done=done)
        if len(out) != len(batch):
            error = RuntimeError(f"engine {self.name!r} returned {len(out)} results for a batch of {len(batch)} calls")
            return [error] * len(batch)
        return [pin_kv_handles(self._id, lease.info, r) for r in out]

    async def _lease_after_loss(self, lost: Incarnation, n: int, exc: BaseException) -> Incarnation:
        """Another replica for calls whose actor was lost; its error names the lost actor."""
        try:
            return await self._replicas.lease(None, n, resent=True)
        except EngineUnavailableError as unavailable:
            raise EngineUnavailableError(
                f"{self._lost_error(lost, n, exc, 'and no other replica could take them')}: {unavailable}",
                engine=self.name,
            ) from exc

    # -- errors ----------------------------------------------------------------------------
    def _lost_error(self, incarnation: Incarnation, n: int, exc: BaseException, why: str) -> EngineActorError:
        info = incarnation.info or NOBODY
        error = EngineActorError(
            f"engine {self.name!r}: {info.describe(len(self._replicas))} was lost while running {n} call(s), {why} "
            f"({type(exc).__name__})",
            engine=self.name,
            actor=info,
        )
        error.__cause__ = exc
        return error

    def _kv_lost(self, pin: PinnedToken) -> EngineActorError:
        info = self._replicas.last(pin.slot)
        if info is None or info.actor_id != pin.actor_id:
            info = dataclasses.replace(NOBODY, slot=pin.slot)
        return EngineActorError(
            f"engine {self.name!r}: the KV state of this call was held by {info.describe(len(self._replicas))}, "
            "which was lost; the call cannot run elsewhere",
            engine=self.name,
            actor=info,
        )

    # -- KV affinity -----------------------------------------------------------------------
    def _holder(self, pin: PinnedToken | None) -> Incarnation | None:
        return None if pin is None else self._replicas.holder(pin.slot, pin.actor_id)


class _ActorLost(Exception):
    """Internal: a call's actor was lost (`cause`: Ray's error)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _why_not_resent(movable: bool) -> str:
    return "and was lost again on the replica it was re-sent to" if movable else "and could not be re-sent"
