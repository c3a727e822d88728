"""Engines as pools of Ray actors, for `teola_core.runtime.ray.RayRuntime`.

    pool = RayEnginePool(lambda: SimLLM(LLM_PROFILE), instances=2, num_cpus=1)
    runtime = RayRuntime(EngineSet().add(pool))
    answer = await runtime.run(graph, {"question": "..."})

`import teola_adapters.ray` does not import Ray; building a pool does, and fails with
`pip install "teola[ray]"` when Ray is missing.
"""

from teola_adapters.ray.pool import ActorInfo, EngineActorError, EngineCopy, RayEnginePool, ray_engines

__all__ = ["ActorInfo", "EngineActorError", "EngineCopy", "RayEnginePool", "ray_engines"]
