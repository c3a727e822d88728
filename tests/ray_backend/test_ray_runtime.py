"""The Ray backend: same outputs as the local runtime, cross-query batching, several
instances, KV affinity, and an actor killed mid-batch failing only its own query.

One local Ray cluster serves the whole session (`ray_cluster` in conftest). Nothing here
sleeps to wait: tests await Ray futures and a gate actor.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from ray_test_engines import Embedder, Gate, StatefulLLM, Zero  # noqa: E402

from teola_adapters.simulated.paper_profiles import paper_engines  # noqa: E402
from teola_benchmarks.systems import SYSTEMS  # noqa: E402
from teola_benchmarks.workloads import WORKLOADS  # noqa: E402
from teola_core.engines.protocol import EngineSet  # noqa: E402
from teola_core.ir.builder import GraphBuilder  # noqa: E402
from teola_core.ir.errors import PrimitiveError  # noqa: E402
from teola_core.ir.graph import Graph  # noqa: E402
from teola_core.ir.kinds import MergeMode, PrimitiveKind  # noqa: E402
from teola_core.ir.types import PortType  # noqa: E402
from teola_core.passes import PassManager  # noqa: E402
from teola_core.passes.base import PassContext  # noqa: E402
from teola_core.runtime.base import PrimitiveSpan, Runtime  # noqa: E402
from teola_core.runtime.local import LocalRuntime  # noqa: E402
from teola_core.runtime.ray import RayRuntime  # noqa: E402
from teola_core.runtime.ray_pool import EngineActorError, EngineCopy, RayEnginePool, ray_engines  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _run(coro: Awaitable[Any], timeout: float = 60.0) -> Any:
    """Run a test coroutine; a hang fails the test instead of blocking the suite."""

    async def guarded() -> Any:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(guarded())


class Spans:
    def __init__(self) -> None:
        self.spans: list[PrimitiveSpan] = []

    def on_span(self, span: PrimitiveSpan) -> None:
        self.spans.append(span)


def embed_only(stages: int = 3) -> Graph:
    b = GraphBuilder("embed_only")
    docs = b.input("docs", PortType.TEXTS)
    parts = [b.embed(docs[2 * i : 2 * i + 2], engine="emb", items=2) for i in range(stages)]
    b.output(vectors=b.aggregate(parts, MergeMode.CONCAT))
    return b.build()


def embed_one() -> Graph:
    b = GraphBuilder("embed_one")
    b.output(vectors=b.embed(b.input("docs", PortType.TEXTS), engine="emb"))
    return b.build()


def chat() -> Graph:
    b = GraphBuilder("chat")
    prompt = b.format("Q: {q}", q=b.input("q", PortType.TEXT))
    b.output(answer=b.llm(prompt, engine="llm", max_tokens=8).text)
    return b.build()


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
        pools = ray_engines(paper_engines(time_scale=0.0, responder=workload.model), instances={"llm": 2})
        got = await run_all(RayRuntime(pools, policy=system.policy, own_engines=True), work)
        assert got == expected

    _run(main())


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
        remote = await failure(RayRuntime(ray_engines(EngineSet().add(Embedder())), own_engines=True))
        assert remote == local

    _run(main())


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
        remote = await batch_sizes(
            RayRuntime(ray_engines(EngineSet().add(Embedder())), max_batch={"emb": 16}, own_engines=True)
        )
        assert remote == local
        assert max(remote) == 8  # 16 items of 2-item stages: queries share batches

    _run(main())


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
            infos = await pool.refresh()
            assert len({i.pid for i in infos}) == 2 and len({i.actor_id for i in infos}) == 2
            assert all(n > 0 for n in pool.served)
        finally:
            await runtime.close()

    _run(main())


# -- failures ------------------------------------------------------------------------------
def test_a_killed_actor_fails_only_its_in_flight_query_and_is_restarted() -> None:
    async def main() -> None:
        gate = ray.remote(Gate).remote()
        pool = await RayEnginePool.create(EngineCopy(Embedder(gate=gate)), instances=2)
        runtime = RayRuntime(EngineSet().add(pool), own_engines=True)
        try:
            blocked = asyncio.ensure_future(runtime.run(embed_one(), {"docs": ["block"]}, query_id="victim"))
            victim_id = await gate.arrived.remote()  # its batch is running on this actor
            (slot,) = [i.slot for i in pool.infos if i.actor_id == victim_id]
            old_pid = pool.infos[slot].pid
            # another query runs meanwhile, on the other actor
            assert await runtime.run(embed_one(), {"docs": ["x"]}) == {"vectors": ["X"]}
            ray.kill(pool.actors[slot], no_restart=False)
            with pytest.raises(PrimitiveError, match=rf"query victim.*EngineActorError: engine 'emb'.*{victim_id}"):
                await blocked
            assert isinstance(blocked.exception().error, EngineActorError)  # type: ignore[union-attr]
            # the next queries succeed, including on the restarted actor
            served = pool.served[slot]
            for i in range(2):
                assert await runtime.run(embed_one(), {"docs": [f"d{i}"]}) == {"vectors": [f"D{i}"]}
            assert pool.served[slot] > served
            assert pool.infos[slot].actor_id == victim_id and pool.infos[slot].pid != old_pid
        finally:
            await runtime.close()
            ray.kill(gate)

    _run(main())


def test_close_leaves_a_cluster_it_did_not_start() -> None:
    async def main() -> None:
        runtime = RayRuntime(lambda: ray_engines(EngineSet().add(Embedder())), own_engines=True)
        assert await runtime.run(embed_one(), {"docs": ["a"]}) == {"vectors": ["A"]}
        await runtime.close()

    _run(main())
    assert ray.is_initialized()


# -- overhead ------------------------------------------------------------------------------
def dispatch_rate(runtime: Runtime, queries: int) -> tuple[float, float]:
    """Primitives per second over `queries` concurrent 3-primitive queries on zero-latency
    engines, and the mean latency of one such query run alone (seconds)."""
    b = GraphBuilder("rate")
    q = b.input("q", PortType.TEXT)
    b.embed(b.call(lambda s: [s], {"s": q}, inline=True), engine="emb")
    b.output(a=b.llm(b.format("{q}", q=q), engine="llm", max_tokens=1).text)
    graph = b.build()

    async def main() -> tuple[float, float]:
        try:
            await runtime.run(graph, {"q": "warm"})
            began = time.perf_counter()
            for i in range(20):
                await runtime.run(graph, {"q": f"alone{i}"})
            alone = (time.perf_counter() - began) / 20
            began = time.perf_counter()
            await asyncio.gather(*(runtime.run(graph, {"q": f"{i}"}) for i in range(queries)))
            return 3 * queries / (time.perf_counter() - began), alone
        finally:
            await runtime.close()

    return _run(main())


def test_dispatch_overhead_against_the_local_backend() -> None:
    engines = EngineSet().add(Zero("emb")).add(Zero("llm"))
    local, local_alone = dispatch_rate(LocalRuntime(engines), 300)
    remote, remote_alone = dispatch_rate(RayRuntime(ray_engines(engines), own_engines=True), 300)
    print(
        f"\nzero-latency engines, 300 concurrent queries: local {local:,.0f} primitives/s, ray {remote:,.0f}/s;"
        f" one query alone (3 engine calls, 2 in sequence): local {local_alone * 1e3:.2f} ms,"
        f" ray {remote_alone * 1e3:.2f} ms"
    )
    assert remote > 50
