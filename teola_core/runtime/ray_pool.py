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

Routing: a batch goes to the least-loaded *ready* replica (ties rotate). A decode whose
KV handle this pool produced goes to the replica that produced it (the pool tags each
handle with the actor that holds its state).

Loss: each replica has a watch call pending on its actor, so the driver learns of a
death (the process, or its node) as an event, stops routing to it and starts a
replacement from the factory it keeps (actors have `max_restarts=0`: nothing is left
for Ray to rebuild from its object store). A call that was running on a lost actor is
retried once on another replica (engine calls are stateless), except a call whose KV
state lived there, an INGEST (a write may have happened), and a stream that had already
yielded: those fail with `EngineActorError` naming the engine, the actor, its pid and
node. A call finding no ready replica waits, up to `replica_wait_s`, for one to
(re)start, and fails at once with `EngineUnavailableError` when no live node offers
what a replica needs (its only node is gone).

Errors raised by the engine itself reach the runtime as the original exception, so they
read as on the local backend. State: each replica has its own engine state; an engine
whose calls read what earlier calls wrote (an in-process vector store) needs one replica.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from teola_core.engines.protocol import Call, CallResult, Engine
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.types import KVHandle
from teola_core.runtime.ray_actor import (
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
from teola_core.runtime.ray_options import DEFAULT_REPLICA_WAIT_S, EngineOptions

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
# Scheduling options the placement check cannot model: with them, a replica is assumed placeable.
_UNMODELLED = ("scheduling_strategy", "placement_group", "label_selector", "accelerator_type")
_RECHECK_S = 1.0  # at most one placement check per second, when calls find no ready replica


@dataclass(frozen=True)
class _Pinned:
    """A KV handle's engine-private token, tagged with the pool and actor that hold its state."""

    pool: str
    slot: int
    actor_id: str
    token: Any


class _Incarnation:
    """One actor of a slot; a replacement is a new incarnation (calls in flight keep theirs)."""

    __slots__ = ("actor", "info", "load")

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.info: ActorInfo | None = None
        self.load = 0  # calls in flight


class _Replica:
    __slots__ = ("current", "final", "last", "restarts", "served", "slot", "state", "why")

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.state = "idle"  # idle -> starting -> ready -> starting (replacement) ... | lost | closed
        self.current: _Incarnation | None = None
        self.last: ActorInfo | None = None  # the latest incarnation that was ready
        self.restarts = 0
        self.served = 0
        self.why = ""  # why it is lost
        self.final = False  # lost for good (its engine cannot build, or no restarts left)


class _Signal:
    """Wakes every waiter, on any thread or event loop, when the pool's replicas change."""

    def __init__(self) -> None:
        self._waiters: list[concurrent.futures.Future[None]] = []

    def waiter(self) -> concurrent.futures.Future[None]:  # call under the pool's lock
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._waiters.append(future)
        return future

    def notify(self) -> None:  # call under the pool's lock
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if future.set_running_or_notify_cancel():
                future.set_result(None)


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
            self._factory = ray.cloudpickle.dumps(factory)  # kept: every replacement is built from it
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
        self._actor_class = ray.remote(EngineActor).options(**actor)
        self._placement_modelled = not any(k in self.options.actor_options for k in _UNMODELLED)
        self._id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._signal = _Signal()
        self._replicas = [_Replica(slot) for slot in range(instances)]
        self._maintenance: concurrent.futures.ThreadPoolExecutor | None = None
        self._cursor = 0
        self.resent = 0  # calls re-sent to another replica after their actor was lost
        self._closed = False
        self._failed: BaseException | None = None
        self._last_check = float("-inf")
        self._checking = False
        self._description: EngineDescription | None = description
        if description is None:
            self._start_and_wait(factory)
            description = self._description
            assert description is not None
        elif start:
            self.start()
        self.name = name or description.name
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
        with self._lock:
            if self._maintenance is not None or self._closed:
                return
            self._maintenance = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"teola-ray:{self._id[:6]}")
            for replica in self._replicas:
                replica.state = "starting"
            self._signal.notify()
        for replica in self._replicas:
            self._submit(self._launch, replica.slot)

    def fail(self, error: BaseException) -> None:
        """The pool cannot start (e.g. Ray did not connect): calls fail with `error` as the cause."""
        with self._lock:
            self._failed = error
            self._signal.notify()

    def _start_and_wait(self, factory: EngineFactory) -> None:
        """Start, and block until every replica is ready (or one cannot start)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(
                "RayEnginePool(...) blocks until its actors have built their engines: inside an event loop "
                "use `await RayEnginePool.create(...)`"
            )
        self.start()
        deadline = time.monotonic() + self.options.replica_wait_s
        while True:
            with self._lock:
                states = [r.state for r in self._replicas]
                lost = [r.why for r in self._replicas if r.state == "lost"]
                lost += [str(self._failed)] if self._failed is not None else []
                waiter = None if lost or all(s == "ready" for s in states) else self._signal.waiter()
            if lost:
                self.kill()
                raise RuntimeError(f"engine factory {factory!r} failed in its Ray actor: {lost[0]}")
            if waiter is None:
                return
            try:
                waiter.result(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                self.kill()
                raise RuntimeError(
                    f"engine factory {factory!r}: its Ray actors were not ready within "
                    f"replica_wait_s={self.options.replica_wait_s} ({', '.join(states)})"
                ) from None

    async def close(self) -> None:
        """Close each ready replica's engine, then kill every actor (none is replaced)."""
        incarnations = self._shut()
        errors = self._ray.exceptions
        try:
            ready = [i for i in incarnations if i.info is not None]
            results = await asyncio.gather(*(i.actor.close.remote() for i in ready), return_exceptions=True)
            failures = [r for r in results if isinstance(r, BaseException) and not isinstance(r, errors.RayActorError)]
            if failures:
                raise engine_error(failures[0])
        finally:
            self._kill(incarnations)

    def kill(self) -> None:
        """Kill every actor without closing the engines (for synchronous owners and finalizers)."""
        self._kill(self._shut())

    def _shut(self) -> list[_Incarnation]:
        with self._lock:
            if self._closed:
                return []
            self._closed = True
            incarnations = [r.current for r in self._replicas if r.current is not None]
            for replica in self._replicas:
                replica.state, replica.current = "closed", None
            self._signal.notify()
            maintenance, self._maintenance = self._maintenance, None
        if maintenance is not None:
            maintenance.shutdown(wait=False, cancel_futures=True)
        return incarnations

    def _kill(self, incarnations: list[_Incarnation]) -> None:
        if not self._ray.is_initialized():  # at exit, after Ray's own shutdown: the actors are gone
            return
        for incarnation in incarnations:
            self._ray.kill(incarnation.actor, no_restart=True)

    # -- inspection ------------------------------------------------------------------------
    @property
    def actors(self) -> tuple[Any, ...]:
        """The current actor handle of each slot (None while a slot has none)."""
        with self._lock:
            return tuple(r.current.actor if r.current else None for r in self._replicas)

    @property
    def infos(self) -> tuple[ActorInfo | None, ...]:
        """Per slot, the latest actor that was ready (its id, pid and node)."""
        with self._lock:
            return tuple(r.last for r in self._replicas)

    @property
    def states(self) -> tuple[str, ...]:
        """Per slot: "idle", "starting", "ready", "lost" or "closed"."""
        with self._lock:
            return tuple(r.state for r in self._replicas)

    @property
    def served(self) -> tuple[int, ...]:
        """Calls each slot has run (all its incarnations)."""
        with self._lock:
            return tuple(r.served for r in self._replicas)

    async def wait_ready(self) -> None:
        """Wait until every replica is ready (at most `replica_wait_s`); fail if one cannot start."""
        deadline = time.monotonic() + self.options.replica_wait_s
        while True:
            with self._lock:
                lost = [r for r in self._replicas if r.state == "lost"]
                error = self._unavailable() or (self._replica_error(lost[0]) if lost else None)
                if error is None and all(r.state == "ready" for r in self._replicas):
                    return
                waiter = None if error else self._signal.waiter()
            if error is not None:
                raise error
            assert waiter is not None
            if time.monotonic() >= deadline:
                waiter.cancel()
                raise self._not_ready()
            await _changed(waiter, deadline)

    async def refresh(self) -> tuple[ActorInfo | None, ...]:
        """Ask every ready actor who it is now."""
        actors = [a for a in self.actors if a is not None]
        await asyncio.gather(*(a.whoami.remote() for a in actors))
        return self.infos

    # -- the protocol ----------------------------------------------------------------------
    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        results: list[Any] = [None] * len(calls)
        wire: list[Call] = []
        groups: dict[tuple[_Incarnation | None, bool], list[int]] = {}
        for i, call in enumerate(calls):
            pin, plain = self._unpin(call)
            wire.append(plain)
            holder = self._holder(pin)
            if pin is not None and pin.token is not None and holder is None:
                results[i] = self._kv_lost(pin)
                continue
            movable = (pin is None or pin.token is None) and call.node.kind not in _NOT_RETRIED
            groups.setdefault((holder, movable), []).append(i)

        async def run_group(holder: _Incarnation | None, movable: bool, indices: list[int]) -> None:
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
        pin, plain = self._unpin(call)
        holder = self._holder(pin)
        if pin is not None and pin.token is not None and holder is None:
            raise self._kv_lost(pin)
        movable = pin is None or pin.token is None
        errors = self._ray.exceptions
        lease = await self._lease(holder, 1)
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
                self._report_lost(lease, exc)
                if yielded or not movable or attempt == 2:
                    why = "after its first deltas" if yielded else _why_not_resent(movable)
                    raise self._lost_error(lease, 1, exc, why) from exc
                lost: BaseException = exc
            except errors.RayTaskError as exc:
                raise engine_error(exc) from exc
            finally:
                self._release(lease, 1, done=finished or yielded)
                if not finished:
                    self._ray.cancel(generator)
            lease = await self._lease_after_loss(lease, 1, lost)

    # -- running a batch -------------------------------------------------------------------
    async def _run_batch(self, holder: _Incarnation | None, movable: bool, batch: list[Call]) -> list[CallResult]:
        """Run on the holder (or any ready replica); re-send once if `movable` and the actor was lost."""
        lease = await self._lease(holder, len(batch))
        for attempt in (1, 2):
            try:
                return await self._call(lease, batch)
            except _ActorLost as lost:
                if not movable or attempt == 2:
                    why = _why_not_resent(movable)
                    return [self._lost_error(lease, len(batch), lost.cause, why) for _ in batch]
                lease = await self._lease_after_loss(lease, len(batch), lost.cause)
        raise AssertionError("unreachable")

    async def _call(self, lease: _Incarnation, batch: list[Call]) -> list[CallResult]:
        ref = lease.actor.run.remote(batch)
        done = False
        try:
            out = list(await asyncio.wrap_future(ref.future()))  # half the latency of `await ref` (measured)
            done = True
        except asyncio.CancelledError:
            self._ray.cancel(ref)
            raise
        except self._ray.exceptions.RayActorError as exc:
            self._report_lost(lease, exc)
            raise _ActorLost(exc) from exc
        except Exception as exc:  # the engine raised: every call of the batch fails with it, as locally
            done = True
            return [engine_error(exc)] * len(batch)
        finally:
            self._release(lease, len(batch), done=done)
        if len(out) != len(batch):
            error = RuntimeError(f"engine {self.name!r} returned {len(out)} results for a batch of {len(batch)} calls")
            return [error] * len(batch)
        return [self._pin(lease, r) for r in out]

    async def _lease_after_loss(self, lost: _Incarnation, n: int, exc: BaseException) -> _Incarnation:
        """Another replica for calls whose actor was lost; its error names the lost actor."""
        try:
            lease = await self._lease(None, n)
        except EngineUnavailableError as unavailable:
            raise EngineUnavailableError(
                f"{self._lost_error(lost, n, exc, 'and no other replica could take them')}: {unavailable}",
                engine=self.name,
            ) from exc
        with self._lock:
            self.resent += n
        return lease

    # -- choosing a replica ----------------------------------------------------------------
    async def _lease(self, holder: _Incarnation | None, n: int) -> _Incarnation:
        """A ready incarnation for `n` calls (the holder if it is still ready), counted as loaded.

        With none ready, wait (up to `replica_wait_s`) for one to start. When every replica
        is lost, one placement check decides at once: fail, or wait for the relaunch.
        """
        deadline = time.monotonic() + self.options.replica_wait_s
        checked = False
        while True:
            with self._lock:
                incarnation = self._pick(holder)
                if incarnation is not None:
                    incarnation.load += n
                    return incarnation
                error = self._unavailable()
                check = error is None or error.final is False
                check = check and self._claim_check()
                wait = error is None or (not checked and not error.final and (check or self._checking))
                waiter = self._signal.waiter() if wait else None
            if check:
                self._submit(self._placement_check)
            if waiter is None:
                assert error is not None
                raise error
            checked = checked or error is not None
            if time.monotonic() >= deadline:
                waiter.cancel()
                raise self._not_ready()
            await _changed(waiter, deadline)

    def _pick(self, holder: _Incarnation | None) -> _Incarnation | None:
        """The holder if ready, else the least-loaded ready incarnation (ties rotate). Under the lock."""
        ready = [r for r in self._replicas if r.state == "ready" and r.current is not None]
        if holder is not None and any(r.current is holder for r in ready):
            return holder
        if not ready:
            return None
        n = len(self._replicas)
        ready.sort(key=lambda r: (r.current.load, (r.slot - self._cursor) % n))  # type: ignore[union-attr]
        chosen = ready[0]
        self._cursor = (chosen.slot + 1) % n
        return chosen.current

    def _unavailable(self) -> EngineUnavailableError | None:
        """Why no call can run now (under the lock), or None when waiting may help.

        `final` errors (failed, closed, replicas that cannot come back) need no placement check.
        """
        if self._failed is not None:
            error = EngineUnavailableError(
                f"engine {self.name!r}: its Ray actors could not start: {self._failed}", engine=self.name, final=True
            )
            error.__cause__ = self._failed
            return error
        if self._closed:
            return EngineUnavailableError(f"engine {self.name!r}: its Ray pool is closed", engine=self.name, final=True)
        if all(r.state == "lost" for r in self._replicas):
            why = "; ".join(dict.fromkeys(r.why for r in self._replicas))
            final = all(r.final for r in self._replicas)
            message = f"engine {self.name!r}: no replica can run: {why}"
            return EngineUnavailableError(message, engine=self.name, final=final)
        return None

    def _replica_error(self, replica: _Replica) -> EngineUnavailableError:
        message = f"engine {self.name!r}: replica {replica.slot + 1} of {len(self._replicas)} cannot run: {replica.why}"
        return EngineUnavailableError(message, engine=self.name, final=replica.final)

    def _not_ready(self) -> EngineUnavailableError:
        return EngineUnavailableError(
            f"engine {self.name!r}: no replica was ready within replica_wait_s={self.options.replica_wait_s} "
            f"(replicas: {', '.join(self.states)})",
            engine=self.name,
        )

    def _claim_check(self) -> bool:
        """Whether this caller should run a placement check now (none running, none in the last second)."""
        now = time.monotonic()
        if self._checking or now - self._last_check < _RECHECK_S or self._maintenance is None:
            return False
        self._checking, self._last_check = True, now
        return True

    def _holder(self, pin: _Pinned | None) -> _Incarnation | None:
        if pin is None:
            return None
        with self._lock:
            current = self._replicas[pin.slot].current
            ok = current is not None and current.info is not None and current.info.actor_id == pin.actor_id
            return current if ok and self._replicas[pin.slot].state == "ready" else None

    def _release(self, incarnation: _Incarnation, n: int, *, done: bool) -> None:
        with self._lock:
            incarnation.load -= n
            if done and incarnation.info is not None:
                self._replicas[incarnation.info.slot].served += n

    # -- replicas: started, lost, replaced (all on the pool's maintenance thread) -----------
    def _submit(self, fn: Callable[..., None], *args: Any) -> None:
        with self._lock:
            maintenance = self._maintenance
            if maintenance is None:
                return
            try:
                done = maintenance.submit(fn, *args)
            except RuntimeError:  # shut down by close() meanwhile: nothing left to maintain
                return
        done.add_done_callback(self._maintained)

    def _maintained(self, done: concurrent.futures.Future[None]) -> None:
        """A maintenance step raised (a bug, or Ray failing): fail the pool's calls instead of hanging them."""
        error = None if done.cancelled() else done.exception()
        if error is not None:
            self.fail(RuntimeError(f"engine {self.name!r}: managing its Ray actors failed: {error!r}"))

    def _launch(self, slot: int) -> None:
        why = self._unplaceable()
        with self._lock:
            replica = self._replicas[slot]
            if replica.state != "starting":
                return
            if why is not None:
                replica.state, replica.why = "lost", why
                self._signal.notify()
                return
        incarnation = _Incarnation(self._actor_class.remote(self._factory, slot))
        with self._lock:
            stale = replica.state != "starting" or replica.current is not None
            if not stale:
                replica.current = incarnation
        if stale:  # closed (or lost) meanwhile
            self._kill([incarnation])
            return
        ref = incarnation.actor.describe.remote()
        ref.future().add_done_callback(lambda f: self._submit(self._on_described, slot, incarnation, f))

    def _on_described(self, slot: int, incarnation: _Incarnation, future: concurrent.futures.Future[Any]) -> None:
        errors = self._ray.exceptions
        try:
            description, info = future.result()
        except errors.RayActorError as exc:
            self._lost(slot, incarnation, exc)
            return
        with self._lock:
            replica = self._replicas[slot]
            if replica.current is not incarnation or replica.state != "starting":
                return
            incarnation.info = replica.last = info
            replica.state = "ready"
            if self._description is None:
                self._description = description
            self._signal.notify()
        watch = incarnation.actor.watch.remote()
        watch.future().add_done_callback(lambda f: self._submit(self._lost, slot, incarnation, f.exception()))

    def _report_lost(self, incarnation: _Incarnation, exc: BaseException) -> None:
        """A call saw its actor fail: stop routing to it now; replace it on the maintenance thread."""
        slot = incarnation.info.slot if incarnation.info is not None else None
        if slot is None:
            return
        with self._lock:
            replica = self._replicas[slot]
            if replica.current is incarnation and replica.state == "ready":
                replica.state = "starting"  # no new calls; `_lost` replaces it
        self._submit(self._lost, slot, incarnation, exc)

    def _lost(self, slot: int, incarnation: _Incarnation, exc: BaseException | None) -> None:
        with self._lock:
            replica = self._replicas[slot]
            if replica.current is not incarnation:
                return  # an older incarnation, already replaced
            replica.current = None
            init_failed = bool(getattr(exc, "actor_init_failed", False))
            if init_failed:
                replica.state, replica.final = "lost", True
                replica.why = f"its engine failed to build in the actor: {str(exc).strip().splitlines()[-1]}"
            elif -1 < self.options.max_restarts <= replica.restarts:
                replica.state, replica.final = "lost", True
                replica.why = f"replica {slot + 1} was lost {replica.restarts + 1} times (max_restarts)"
            else:
                replica.state = "starting"
                replica.restarts += 1
            self._signal.notify()
        self._ray.kill(incarnation.actor, no_restart=True)  # an unreachable actor may still run: end it
        self._launch(slot)

    def _placement_check(self) -> None:
        """Lost replicas start again once they can be placed; pending ones that cannot are lost."""
        try:
            why = self._unplaceable()
            pending: list[_Incarnation] = []
            relaunch: list[int] = []
            with self._lock:
                for replica in self._replicas:
                    if why is not None and replica.state == "starting":
                        if replica.current is not None:
                            pending.append(replica.current)
                        replica.state, replica.why, replica.current = "lost", why, None
                    elif why is None and replica.state == "lost" and not replica.final:
                        replica.state = "starting"
                        relaunch.append(replica.slot)
                self._signal.notify()
            self._kill(pending)
            for slot in relaunch:
                self._launch(slot)
        finally:
            with self._lock:
                self._checking = False
                self._signal.notify()

    def _unplaceable(self) -> str | None:
        """None when some live node offers what a replica needs; else why none does."""
        if not self._placement_modelled:
            return None
        need = self.options.request()
        alive = [n for n in self._ray.nodes() if n.get("Alive")]
        if any(all(n.get("Resources", {}).get(k, 0.0) >= v for k, v in need.items()) for n in alive):
            return None
        lost = sorted({f"{r.last.node_id[:12]} at {r.last.node_ip}" for r in self._replicas if r.last is not None})
        where = f"; it ran on node {', '.join(lost)}, which is gone" if lost else ""
        return f"no live Ray node offers what a replica needs ({_format(need)}){where}"

    # -- errors ----------------------------------------------------------------------------
    def _lost_error(self, incarnation: _Incarnation, n: int, exc: BaseException, why: str) -> EngineActorError:
        info = incarnation.info or NOBODY
        error = EngineActorError(
            f"engine {self.name!r}: {info.describe(len(self._replicas))} was lost while running {n} call(s), {why} "
            f"({type(exc).__name__})",
            engine=self.name,
            actor=info,
        )
        error.__cause__ = exc
        return error

    def _kv_lost(self, pin: _Pinned) -> EngineActorError:
        with self._lock:
            info = self._replicas[pin.slot].last
        if info is None or info.actor_id != pin.actor_id:
            info = dataclasses.replace(NOBODY, slot=pin.slot)
        return EngineActorError(
            f"engine {self.name!r}: the KV state of this call was held by {info.describe(len(self._replicas))}, "
            "which was lost; the call cannot run elsewhere",
            engine=self.name,
            actor=info,
        )

    # -- KV affinity -----------------------------------------------------------------------
    def _pin(self, incarnation: _Incarnation, result: CallResult) -> CallResult:
        info = incarnation.info
        if info is None or isinstance(result, BaseException) or not isinstance(result, Mapping):
            return result
        if not any(isinstance(v, KVHandle) for v in result.values()):
            return result
        return {
            k: dataclasses.replace(v, token=_Pinned(self._id, info.slot, info.actor_id, v.token))
            if isinstance(v, KVHandle)
            else v
            for k, v in result.items()
        }

    def _unpin(self, call: Call) -> tuple[_Pinned | None, Call]:
        """The pin of this call's KV state (if any), and the call as the actor gets it (plain handles).

        Only the query id, node and inputs travel: per-query state of the driver stays there.
        """
        pin: _Pinned | None = None
        inputs = dict(call.inputs)
        for port, value in call.inputs.items():
            if isinstance(value, KVHandle) and isinstance(value.token, _Pinned) and value.token.pool == self._id:
                pin = value.token if pin is None else pin
                inputs[port] = dataclasses.replace(value, token=value.token.token)
        return pin, Call(call.query_id, call.node, inputs)


async def _changed(waiter: concurrent.futures.Future[None], deadline: float) -> None:
    """Wait for the pool's signal (from any thread) until `deadline` (monotonic)."""
    wakeup = asyncio.wrap_future(waiter)
    try:
        await asyncio.wait({wakeup}, timeout=max(0.0, deadline - time.monotonic()))
    finally:
        wakeup.cancel()


class _ActorLost(Exception):
    """Internal: a call's actor was lost (`cause`: Ray's error)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _why_not_resent(movable: bool) -> str:
    return "and was lost again on the replica it was re-sent to" if movable else "and could not be re-sent"


def _format(need: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(need.items()))
