"""The actors behind one `RayEnginePool`: started, watched, leased to calls, replaced when lost.

Each slot (replica) has at most one live actor at a time, its *incarnation*; a lost one
is replaced from the pool's pickled factory by a new incarnation (actors have
`max_restarts=0`: nothing is left for Ray to rebuild from its object store), while calls
in flight keep the incarnation they were sent to, so errors name that very actor.

    idle -> starting -> ready -> starting (lost: a replacement) -> ready -> ...
    starting -> lost: no live node offers what it needs (-> starting when one does),
                      its engine cannot build, or its restarts are used up

Death is an event: every ready actor has a `watch` call pending that fails when the
actor (or its node) dies. State changes happen on one maintenance thread per pool; calls
from any thread or event loop read the state under a lock and wait on a signal.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any

from teola_core.runtime.ray.actor import ActorInfo, EngineDescription, EngineUnavailableError, require_ray
from teola_core.runtime.ray.options import EngineOptions
from teola_core.runtime.ray.placement import placement_modelled, unplaceable_reason
from teola_core.runtime.ray.replica_errors import none_ready, pool_unavailable, replica_cannot_run
from teola_core.runtime.ray.replica_state import Incarnation, ReplicaSignal, ReplicaSlot, wait_for_change

_RECHECK_S = 1.0  # at most one placement check per second, when calls find no ready replica


class Replicas:
    """The replicas of one engine (see the module docstring).

    factory: the pickled engine factory each actor builds its engine from. actor_class:
    the remote actor class with its options. name: the engine's name, for messages (the
    pool sets it once it knows it).
    """

    def __init__(self, factory: bytes, actor_class: Any, options: EngineOptions, name: str) -> None:
        self.name = name
        self.description: EngineDescription | None = None  # from the first actor that is ready
        self.resent = 0  # calls re-sent to another replica after their actor was lost
        self._factory = factory
        self._actor_class = actor_class
        self._options = options
        self._placement_modelled = placement_modelled(options)
        self._ray = require_ray()
        self._lock = threading.Lock()
        self._signal = ReplicaSignal()
        self._replicas = [ReplicaSlot(slot) for slot in range(options.num_replicas)]
        self._maintenance: concurrent.futures.ThreadPoolExecutor | None = None
        self._cursor = 0
        self._closed = False
        self._failed: BaseException | None = None
        self._last_check = float("-inf")
        self._checking = False

    def __len__(self) -> int:
        return len(self._replicas)

    def start(self) -> None:
        """Start the replicas' actors (Ray must be connected); returns at once."""
        with self._lock:
            if self._maintenance is not None or self._closed:
                return
            self._maintenance = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"teola-ray:{self.name}")
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

    def start_and_wait(self, what: str) -> None:
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
        deadline = time.monotonic() + self._options.replica_wait_s
        while True:
            with self._lock:
                states = [r.state for r in self._replicas]
                lost = [r.why for r in self._replicas if r.state == "lost"]
                lost += [str(self._failed)] if self._failed is not None else []
                waiter = None if lost or all(s == "ready" for s in states) else self._signal.waiter()
            if lost:
                self.kill(self.shut())
                raise RuntimeError(f"{what} failed in its Ray actor: {lost[0]}")
            if waiter is None:
                return
            try:
                waiter.result(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                self.kill(self.shut())
                raise RuntimeError(
                    f"{what}: its Ray actors were not ready within "
                    f"replica_wait_s={self._options.replica_wait_s} ({', '.join(states)})"
                ) from None

    def shut(self) -> list[Incarnation]:
        """No more calls or replacements; the incarnations to close and kill."""
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

    def kill(self, incarnations: list[Incarnation]) -> None:
        if not self._ray.is_initialized():  # at exit, after Ray's own shutdown: the actors are gone
            return
        for incarnation in incarnations:
            self._ray.kill(incarnation.actor, no_restart=True)

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
        deadline = time.monotonic() + self._options.replica_wait_s
        while True:
            with self._lock:
                lost = [r for r in self._replicas if r.state == "lost"]
                error = self._unavailable() or (
                    replica_cannot_run(self.name, lost[0], len(self._replicas)) if lost else None
                )
                if error is None and all(r.state == "ready" for r in self._replicas):
                    return
                waiter = None if error else self._signal.waiter()
            if error is not None:
                raise error
            assert waiter is not None
            if time.monotonic() >= deadline:
                waiter.cancel()
                raise self._not_ready()
            await wait_for_change(waiter, deadline)

    async def lease(self, holder: Incarnation | None, n: int, *, resent: bool = False) -> Incarnation:
        """A ready incarnation for `n` calls (the holder if it is still ready), counted as loaded.

        With none ready, wait (up to `replica_wait_s`) for one to start. When every replica
        is lost, one placement check decides at once: fail, or wait for the relaunch.
        """
        deadline = time.monotonic() + self._options.replica_wait_s
        checked = False
        while True:
            with self._lock:
                incarnation = self._pick(holder)
                if incarnation is not None:
                    incarnation.load += n
                    self.resent += n if resent else 0
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
            await wait_for_change(waiter, deadline)

    def _pick(self, holder: Incarnation | None) -> Incarnation | None:
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
        """Why no call can run now (under the lock), or None when waiting may help."""
        return pool_unavailable(self.name, self._replicas, self._failed, self._closed)

    def _not_ready(self) -> EngineUnavailableError:
        return none_ready(self.name, self._options.replica_wait_s, self.states)

    def _claim_check(self) -> bool:
        """Whether this caller should run a placement check now (none running, none in the last second)."""
        now = time.monotonic()
        if self._checking or now - self._last_check < _RECHECK_S or self._maintenance is None:
            return False
        self._checking, self._last_check = True, now
        return True

    def holder(self, slot: int, actor_id: str) -> Incarnation | None:
        """The incarnation `actor_id` of `slot` if it is still the slot's and ready."""
        with self._lock:
            replica = self._replicas[slot]
            current = replica.current
            ok = current is not None and current.info is not None and current.info.actor_id == actor_id
            return current if ok and replica.state == "ready" else None

    def last(self, slot: int) -> ActorInfo | None:
        with self._lock:
            return self._replicas[slot].last

    def release(self, incarnation: Incarnation, n: int, *, done: bool) -> None:
        with self._lock:
            incarnation.load -= n
            if done and incarnation.info is not None:
                self._replicas[incarnation.info.slot].served += n

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
        incarnation = Incarnation(self._actor_class.remote(self._factory, slot))
        with self._lock:
            stale = replica.state != "starting" or replica.current is not None
            if not stale:
                replica.current = incarnation
        if stale:  # closed (or lost) meanwhile
            self.kill([incarnation])
            return
        ref = incarnation.actor.describe.remote()
        ref.future().add_done_callback(lambda f: self._submit(self._on_described, slot, incarnation, f))

    def _on_described(self, slot: int, incarnation: Incarnation, future: concurrent.futures.Future[Any]) -> None:
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
            if self.description is None:
                self.description = description
            self._signal.notify()
        watch = incarnation.actor.watch.remote()
        watch.future().add_done_callback(lambda f: self._submit(self._lost, slot, incarnation, f.exception()))

    def report_lost(self, incarnation: Incarnation, exc: BaseException) -> None:
        """A call saw its actor fail: stop routing to it now; replace it on the maintenance thread."""
        slot = incarnation.info.slot if incarnation.info is not None else None
        if slot is None:
            return
        with self._lock:
            replica = self._replicas[slot]
            if replica.current is incarnation and replica.state == "ready":
                replica.state = "starting"  # no new calls; `_lost` replaces it
        self._submit(self._lost, slot, incarnation, exc)

    def _lost(self, slot: int, incarnation: Incarnation, exc: BaseException | None) -> None:
        with self._lock:
            replica = self._replicas[slot]
            if replica.current is not incarnation:
                return  # an older incarnation, already replaced
            replica.current = None
            init_failed = bool(getattr(exc, "actor_init_failed", False))
            if init_failed:
                replica.state, replica.final = "lost", True
                replica.why = f"its engine failed to build in the actor: {str(exc).strip().splitlines()[-1]}"
            elif -1 < self._options.max_restarts <= replica.restarts:
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
            pending: list[Incarnation] = []
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
            self.kill(pending)
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
        ran_on = [r.last for r in self._replicas if r.last is not None]
        return unplaceable_reason(self._options.request(), self._ray.nodes(), ran_on)
