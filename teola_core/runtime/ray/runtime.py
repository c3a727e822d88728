"""The Ray backend: the local runtime's schedulers in the driver, engines in Ray actors.

The scheduler state machines are the local backend's, so batching spans every query
exactly as locally and outputs are the same; what changes is where an engine's batch
runs. Engines are placed as the `ray=` option says (`teola_core.runtime.ray.options`):
each in a `RayEnginePool` of actors placed by resources, except the engines that stay in
the driver (`Engine.driver_only`, `in_driver`) — mixed placement in one runtime.

    runtime = RayRuntime(engines, ray={"address": "auto", "engines": {"llm": {"num_gpus": 1}}})
    answer = await runtime.run(graph, {"question": "..."})
    await runtime.close()        # kills the actors it started; leaves a cluster it did not start

`RayEngines` is the placement of one optimized object's engines, shared by the runtimes
of all its event loops (a drop-in's sync thread and its async callers), so they use one
set of actors. Nothing blocks an event loop: connecting and starting actors happen on a
background thread, and a call made meanwhile waits for its replica (`replica_wait_s`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

from teola_core.engines.protocol import EngineSet
from teola_core.runtime.local import LocalRuntime
from teola_core.runtime.ray.actor import require_ray
from teola_core.runtime.ray.options import RayOptions
from teola_core.runtime.ray.pool import RayEnginePool

__all__ = ["RayEngines", "RayRuntime", "connect", "require_ray"]


def connect(address: str | None = None, **init_kwargs: Any) -> bool:
    """Connect this process to Ray (blocks for seconds); True when this call made the connection.

    An existing connection is reused as it is (`address` is then ignored). Otherwise
    `ray.init(address=...)`: None joins the cluster `RAY_ADDRESS` names or starts a local
    one; "auto" joins the local node's cluster; "ray://host:10001" a remote one.
    """
    ray = require_ray()
    if ray.is_initialized():
        return False
    ray.init(address=address, **init_kwargs)
    return True


class RayEngines:
    """One app's engines on Ray: pools of actors where `options` place them, the rest as given.

    `engines` is the app's engine set; pools are made of copies of its engine objects
    (they must pickle). `start()` returns at once: a background thread connects to Ray
    and starts the actors. Close with `close()` (kills the actors) or `await aclose()`
    (closes their engines first).
    """

    def __init__(self, engines: EngineSet, options: RayOptions | Mapping[str, Any] | None = None) -> None:
        self.options = RayOptions.parse(options)
        placements = self.options.placements(engines)
        self.engines = EngineSet()
        self.pools: dict[str, RayEnginePool] = {}
        for name, engine in engines.engines.items():
            placement = placements[name]
            if isinstance(engine, RayEnginePool) and name in self.options.engines:
                raise ValueError(
                    f"ray=: engine {name!r} is a RayEnginePool built by the app: its own arguments place it, "
                    "drop it from ray['engines']"
                )
            if placement is None or isinstance(engine, RayEnginePool):
                self.engines.add(engine, name)
            else:
                self.pools[name] = RayEnginePool.copy_of(engine, placement, name=name, start=False)
                self.engines.add(self.pools[name], name)
        self.connected_here = False
        self.closed = False
        self._lock = threading.Lock()
        self._started = False
        self._connected = threading.Event()
        self._released = threading.Event()

    def where(self) -> dict[str, str]:
        """Per engine: "driver", or its replicas and what each reserves (for `explain()`)."""
        out = {}
        for name in self.engines.engines:
            pool = self.pools.get(name)
            if pool is None:
                out[name] = "driver"
            else:
                need = ", ".join(f"{k}={v:g}" for k, v in sorted(pool.options.request().items()))
                out[name] = f"{pool.options.num_replicas} Ray actor(s), each {need}"
        return out

    def start(self) -> None:
        """Connect and start the actors on a background thread (once; returns at once)."""
        with self._lock:
            if self._started or not self.pools:
                return
            self._started = True
        threading.Thread(target=self._connect_and_start, name="teola-ray-start", daemon=True).start()

    def _connect_and_start(self) -> None:
        """Connect, start the pools; if this thread started Ray's processes, stay until they stop.

        Ray starts a local cluster's processes with PR_SET_PDEATHSIG, which Linux fires when
        the *thread* that started them exits: this thread must outlive them.
        """
        try:
            self.connected_here = connect(self.options.address, **self.options.init)
        except Exception as exc:
            where = self.options.address or "RAY_ADDRESS or a new local cluster"
            error = ConnectionError(f"could not connect to Ray ({where}): {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            for pool in self.pools.values():
                pool.fail(error)
            return
        finally:
            self._connected.set()
        for pool in self.pools.values():
            pool.start()
        if self.connected_here:
            self._released.wait()

    def close(self) -> None:
        """Kill the actors (no engine `close()`: for synchronous owners and finalizers)."""
        self.closed = True
        for pool in self.pools.values():
            pool.kill()

    async def aclose(self) -> None:
        """Close every pool's engines, then kill its actors."""
        self.closed = True
        results = await asyncio.gather(*(p.close() for p in self.pools.values()), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    async def disconnect(self) -> None:
        """Shut Ray down if this placement connected it (waits for the connection attempt first)."""
        if self._started:
            await asyncio.to_thread(self._connected.wait)
        if self.connected_here:
            self.connected_here = False
            try:
                await asyncio.to_thread(require_ray().shutdown)
            finally:
                self._released.set()


class RayRuntime(LocalRuntime):
    """`LocalRuntime` whose engines run where a `RayEngines` placement puts them; same outputs.

    engines: the app's engines (placed here as `ray` says, owned: `close()` kills the
    actors, and shuts Ray down if this runtime connected it), or a shared `RayEngines`
    (not owned). own_engines: also close every engine of the set on `close()` (pools you
    built and gave, driver engines). Other options as for `LocalRuntime`.
    """

    def __init__(
        self,
        engines: EngineSet | RayEngines,
        policy: str = "topology",
        *,
        ray: RayOptions | Mapping[str, Any] | None = None,
        own_engines: bool = False,
        **options: Any,
    ) -> None:
        require_ray()
        if isinstance(engines, RayEngines):
            if ray is not None:
                raise ValueError("RayRuntime: give ray= options to the shared RayEngines, not to the runtime")
            self.placed, self._owns_placement = engines, False
        else:
            self.placed, self._owns_placement = RayEngines(engines, ray), True
        super().__init__(self.placed.engines, policy, **options)
        self.placed.start()
        self._own_engines = own_engines

    async def close(self) -> None:
        """Stop the runtime; close what it owns; disconnect only if it connected."""
        try:
            await super().close()
        finally:
            try:
                if self._own_engines:
                    await self.placed.engines.close()
                elif self._owns_placement:
                    await self.placed.aclose()
            finally:
                if self._owns_placement:
                    await self.placed.disconnect()
