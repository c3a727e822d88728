"""The Ray backend: same outputs as the local runtime, cross-query batching, several
replicas, KV affinity, and what it costs per query.

One multi-node Ray cluster serves the whole session (`ray_cluster` in conftest). Nothing
here sleeps to wait: tests await Ray futures.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from ray_helpers import Spans, chat, embed_one, embed_only, rag, run  # noqa: E402
from ray_test_engines import Embedder, StatefulLLM, Zero  # noqa: E402

from teola_adapters.simulated.paper_profiles import paper_engines  # noqa: E402
from teola_benchmarks.systems import SYSTEMS  # noqa: E402
from teola_benchmarks.workloads import WORKLOADS  # noqa: E402
from teola_core.engines.protocol import EngineSet  # noqa: E402
from teola_core.ir.errors import PrimitiveError  # noqa: E402
from teola_core.ir.graph import Graph  # noqa: E402
from teola_core.ir.kinds import PrimitiveKind  # noqa: E402
from teola_core.passes import PassManager  # noqa: E402
from teola_core.passes.base import PassContext  # noqa: E402
from teola_core.runtime.base import Runtime  # noqa: E402
from teola_core.runtime.local import LocalRuntime  # noqa: E402
from teola_core.runtime.ray import RayRuntime  # noqa: E402
from teola_core.runtime.ray.pool import EngineCopy, RayEnginePool  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")


# -- same outputs as the local runtime -----------------------------------------------------
def test_benchmark_workload_with_partial_decode_equals_local() -> None:
    """advanced_rag through all passes (decode pipelining: streamed partial decodes), 6 queries at once."""
    workload = WORKLOADS["advanced_rag"]
    system = SYSTEMS["teola"]

    def graphs(engines: EngineSet) -> list[tuple[Graph, dict[str, Any]]]:
        manager, ctx = PassManager(system.pass_list()), PassContext(profiles=engines.profiles())
        template = workload.template(0.0)
        queries = [dict(workload.make_query(i)) for i in range(6)]
        return [(manager.optimize(template.instantiate(q), ctx).e_graph, q) for q in queries]

    async def run_all(runtime: Runtime, work: list[tuple[Graph, dict[str, Any]]]) -> list[dict[str, Any]]:
        try:
            return await asyncio.gather(*(runtime.run(g, q, query_id=f"q{i}") for i, (g, q) in enumerate(work)))
        finally:
            await runtime.close()

    async def main() -> None:
        local_engines = paper_engines(time_scale=0.0, responder=workload.model)
        work = graphs(local_engines)
        assert any(n.kind is PrimitiveKind.PARTIAL_DECODE for n in work[0][0].nodes.values())
        expected = await run_all(LocalRuntime(local_engines, policy=system.policy), work)
        engines = paper_engines(time_scale=0.0, responder=workload.model)
        got = await run_all(RayRuntime(engines, system.policy, ray={"engines": {"llm": {"num_replicas": 2}}}), work)
        assert got == expected

    run(main())


def test_engine_errors_read_as_on_the_local_backend() -> None:
    """An engine that raises fails its batch's calls with the engine's own exception, not a Ray wrapper."""

    async def failure(runtime: Runtime) -> str:
        try:
            with pytest.raises(PrimitiveError) as info:
                await runtime.run(embed_one(), {"docs": ["raise"]})
            assert isinstance(info.value.error, ConnectionError)
            assert await runtime.run(embed_one(), {"docs": ["fine"]}) == {"vectors": ["FINE"]}
            return str(info.value)
        finally:
            await runtime.close()

    async def main() -> None:
        local = await failure(LocalRuntime(EngineSet().add(Embedder())))
        remote = await failure(RayRuntime(EngineSet().add(Embedder())))
        assert remote == local

    run(main())


# -- batching and instances ----------------------------------------------------------------
def test_cross_query_batching_happens_as_on_the_local_backend() -> None:
    async def batch_sizes(runtime: Runtime) -> list[int]:
        spans = Spans()
        runtime.add_hook(spans)
        try:
            await asyncio.gather(*(runtime.run(embed_only(), {"docs": list("abcdef")}) for _ in range(6)))
        finally:
            await runtime.close()
        return sorted(s.batch_size for s in spans.spans if s.node.kind is PrimitiveKind.EMBED)

    async def main() -> None:
        local = await batch_sizes(LocalRuntime(EngineSet().add(Embedder()), max_batch={"emb": 16}))
        remote = await batch_sizes(RayRuntime(EngineSet().add(Embedder()), max_batch={"emb": 16}))
        assert remote == local
        assert max(remote) == 8  # 16 items of 2-item stages: queries share batches

    run(main())


def test_several_instances_serve_and_kv_stays_on_its_instance() -> None:
    """Two actors (distinct pids) share the work; every decode finds its prefill's state."""

    async def main() -> None:
        pool = await RayEnginePool.create(EngineCopy(StatefulLLM()), instances=2, concurrency=2)
        assert (pool.limits.instances, pool.limits.concurrency) == (2, 4)
        runtime = RayRuntime(EngineSet().add(pool), own_engines=True)
        try:
            for wave in range(2):  # each wave's prefills form one batch; waves go to different actors
                queries = [f"n{wave}{i}" for i in range(4)]
                answers = await asyncio.gather(*(runtime.run(chat(), {"q": q}) for q in queries))
                assert answers == [{"answer": f"answer to Q: {q}"} for q in queries]
            infos = [i for i in await pool.refresh() if i is not None]
            assert len({i.pid for i in infos}) == 2 and len({i.actor_id for i in infos}) == 2
            assert all(n > 0 for n in pool.served)
        finally:
            await runtime.close()

    run(main())


# -- lifecycle ---------------------------------------------------------------------------
def test_close_leaves_a_cluster_it_did_not_start() -> None:
    async def main() -> None:
        runtime = RayRuntime(EngineSet().add(Embedder()))
        assert await runtime.run(embed_one(), {"docs": ["a"]}) == {"vectors": ["A"]}
        await runtime.close()

    run(main())
    assert ray.is_initialized()


# -- overhead ------------------------------------------------------------------------------
def overhead(runtime: Runtime, burst: int) -> dict[str, float]:
    """On zero-latency engines, a 3-primitive query (embed, then prefill -> decode): its mean
    latency run alone, the time of `burst` queries at once, and their mean engine batch."""

    async def main() -> dict[str, float]:
        spans = Spans()
        try:
            await runtime.run(rag(), {"q": "warm"})
            began = time.perf_counter()
            for i in range(20):
                await runtime.run(rag(), {"q": f"alone{i}"})
            alone = (time.perf_counter() - began) / 20
            runtime.add_hook(spans)
            began = time.perf_counter()
            await asyncio.gather(*(runtime.run(rag(), {"q": f"{i}"}) for i in range(burst)))
            elapsed = time.perf_counter() - began
        finally:
            await runtime.close()
        sizes = [s.batch_size for s in spans.spans if s.node.kind is not PrimitiveKind.FORMAT]
        return {"alone_ms": alone * 1e3, "burst_s": elapsed, "batch": sum(sizes) / len(sizes)}

    return run(main())


def test_overhead_per_query_and_the_batching_that_absorbs_it() -> None:
    """Figures for the README (printed: timings depend on the machine's load, so none is asserted);
    the claim checked: a burst's calls share round trips to the actors, batched as locally."""
    local = overhead(LocalRuntime(EngineSet().add(Zero("emb")).add(Zero("llm"))), 500)
    remote = overhead(RayRuntime(EngineSet().add(Zero("emb")).add(Zero("llm"))), 500)
    print(
        f"\nzero-latency engines, a query = embed, then prefill, then decode (3 engine round trips in a row):"
        f"\n  one at a time: local {local['alone_ms']:.2f} ms, ray {remote['alone_ms']:.2f} ms per query"
        f"\n  500 at once:   local {local['burst_s']:.3f} s, ray {remote['burst_s']:.3f} s"
        f" (mean engine batch: local {local['batch']:.1f}, ray {remote['batch']:.1f} calls)"
    )
    assert remote["batch"] == local["batch"] > 4  # queries share the actors' round trips as they share batches locally
