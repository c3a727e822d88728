"""The Ray backend: the local runtime's schedulers in the driver, engines as Ray actor pools.

The scheduler state machines are the same objects as on the local backend, so batching
spans every query exactly as it does locally and outputs are the same; what changes is
where an engine's batch runs. Engines that are `teola_core.runtime.ray_pool.RayEnginePool`s run
on their actors (several instances, each with its CPUs/GPUs, on any node); any other
engine runs in the driver, as locally (useful for a thin HTTP client). Results come back
as awaited ObjectRefs and streaming-generator items: nothing polls.

    connect("ray://head:10001")                      # or reuse an existing connection
    engines = EngineSet().add(RayEnginePool(factory, instances=2, num_gpus=1))
    runtime = RayRuntime(engines)
    answer = await runtime.run(graph, {"question": "..."})
    await runtime.close()                            # leaves a cluster it did not start

Ray is imported only when a connection is made, so `teola_core` imports without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from teola_core.engines.protocol import EngineSet
from teola_core.ir.graph import Graph
from teola_core.ir.node import Node
from teola_core.runtime.base import Runtime, RuntimeHook
from teola_core.runtime.local import LocalRuntime
from teola_core.scheduler.engine_scheduler import EngineScheduler


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


def connect(address: str | None = None, **init_kwargs: Any) -> bool:
    """Connect this process to Ray; True when this call started the connection.

    An existing connection is reused as it is (`address` is then ignored). Otherwise
    `ray.init(address=...)`: None starts a local cluster, or joins the one `RAY_ADDRESS`
    names; "auto" joins the local node's cluster; "ray://host:port" a remote one.
    """
    ray = require_ray()
    if ray.is_initialized():
        return False
    ray.init(address=address, **init_kwargs)
    return True


class RayRuntime(Runtime):
    """`LocalRuntime` driving engines that run as Ray actor pools; same interface, same outputs.

    engines: the engines, or a function that builds them once Ray is connected (pools
    start actors, so they need the connection first). address / init_kwargs: how to
    connect when this process is not connected yet (see `connect`). own_engines: close
    the engines (killing pools' actors) on `close()`. policy, max_batch, depth_cost,
    to_max_batch, clock: as for `LocalRuntime`.
    """

    def __init__(
        self,
        engines: EngineSet | Callable[[], EngineSet],
        policy: str = "topology",
        *,
        address: str | None = None,
        init_kwargs: Mapping[str, Any] | None = None,
        own_engines: bool = False,
        max_batch: Mapping[str, int | None] | None = None,
        depth_cost: Callable[[Node], float] | None = None,
        to_max_batch: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._started = connect(address, **dict(init_kwargs or {}))
        try:
            self.engines = engines if isinstance(engines, EngineSet) else engines()
            self._local = LocalRuntime(
                self.engines, policy, max_batch=max_batch, depth_cost=depth_cost, to_max_batch=to_max_batch, clock=clock
            )
        except BaseException:
            if self._started:
                require_ray().shutdown()
            raise
        self._own_engines = own_engines

    async def run(
        self,
        graph: Graph,
        inputs: Mapping[str, Any],
        *,
        query_id: str | None = None,
        arrival: float | None = None,
        context: Any = None,
    ) -> dict[str, Any]:
        return await self._local.run(graph, inputs, query_id=query_id, arrival=arrival, context=context)

    def add_hook(self, hook: RuntimeHook) -> None:
        self._local.add_hook(hook)

    def scheduler(self, engine: str) -> EngineScheduler:
        """The engine scheduler of `engine` (for inspection)."""
        return self._local.scheduler(engine)

    async def close(self) -> None:
        """Stop the runtime; close the engines if owned; disconnect only if this runtime connected."""
        try:
            await self._local.close()
        finally:
            try:
                if self._own_engines:
                    await self.engines.close()
            finally:
                if self._started:
                    self._started = False
                    require_ray().shutdown()
