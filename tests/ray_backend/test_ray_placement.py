"""Placement on a real two-node cluster: engines go where their resources say, replicas per
engine, driver-only engines stay in the driver, and one optimized object keeps one set of
actors for all its event loops (pools start without blocking the loop)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from ray_helpers import embed_one, rag, run  # noqa: E402
from ray_test_engines import BrokenInActor, DriverOnly, Embedder, StatefulLLM, missing_model  # noqa: E402

from teola_core.engines.protocol import EngineSet  # noqa: E402
from teola_core.ir.errors import PrimitiveError  # noqa: E402
from teola_core.runtime.backends import RuntimePerLoop  # noqa: E402
from teola_core.runtime.loop_thread import LoopThread  # noqa: E402
from teola_core.runtime.ray import RayRuntime  # noqa: E402
from teola_core.runtime.ray.pool import EngineUnavailableError, RayEnginePool  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_engines_run_where_their_resources_say(resource_nodes: dict[str, str]) -> None:
    """Embedder: two replicas on nodeA; LLM: one on nodeB; every answer as computed locally."""
    options = {
        "engines": {
            "emb": {"num_replicas": 2, "resources": {"nodeA": 1}},
            StatefulLLM: {"resources": {"nodeB": 1}, "concurrency": 2},
        }
    }

    async def main() -> None:
        runtime = RayRuntime(EngineSet().add(Embedder(concurrency=2)).add(StatefulLLM()), ray=options)
        emb, llm = runtime.placed.pools["emb"], runtime.placed.pools["llm"]
        try:
            await asyncio.gather(emb.wait_ready(), llm.wait_ready())
            questions = [f"q{i}" for i in range(12)]
            answers = await asyncio.gather(*(runtime.run(rag(), {"q": q}) for q in questions))
            expected = [{"answer": f"answer to Q: {q} ['{q.upper()}']", "vectors": [q.upper()]} for q in questions]
            assert answers == expected
            assert {i.node_id for i in emb.infos if i} == {resource_nodes["nodeA"]}
            assert len({i.pid for i in emb.infos if i}) == 2  # two actors
            assert [i.node_id for i in llm.infos if i] == [resource_nodes["nodeB"]]
            assert (emb.limits.concurrency, llm.limits.concurrency) == (4, 2)
            assert runtime.placed.where() == {
                "emb": "2 Ray actor(s), each CPU=1, nodeA=1",
                "llm": "1 Ray actor(s), each CPU=1, nodeB=1",
            }
        finally:
            await runtime.close()

    run(main())


def test_driver_only_engines_stay_in_the_driver_and_refuse_actors() -> None:
    engines = EngineSet().add(DriverOnly("local")).add(Embedder())
    runtimes = RuntimePerLoop(engines, "ray")
    assert runtimes.where() == {"local": "driver", "emb": "1 Ray actor(s), each CPU=1"}
    assert runtimes.placed is not None and runtimes.placed.engines["local"] is engines["local"]
    runtimes.close()
    with pytest.raises(ValueError, match=r"engine 'local' \(DriverOnly\) cannot run in a Ray actor"):
        RuntimePerLoop(engines, "ray", ray={"engines": {"local": {"num_replicas": 2}}})
    with pytest.raises(ValueError, match=r"engine 'DriverOnly' \(DriverOnly\) cannot run in a Ray actor"):
        RuntimePerLoop(engines, "ray", ray={"engines": {DriverOnly: {"num_gpus": 1}}})
    # a base class key places the others and leaves driver-only engines where they are
    runtimes = RuntimePerLoop(engines, "ray", ray={"engines": {Embedder: {"num_replicas": 2}}})
    assert runtimes.where()["local"] == "driver" and runtimes.where()["emb"].startswith("2 Ray actor(s)")
    runtimes.close()
    # in_driver keeps one of Teola's engines local too
    runtimes = RuntimePerLoop(engines, "ray", ray={"engines": {"emb": {"in_driver": True}}})
    assert runtimes.placed is not None and not runtimes.placed.pools


def test_one_set_of_actors_serves_every_event_loop_and_starts_without_blocking() -> None:
    """A drop-in's sync thread and its async callers share the pools; `current()` returns at once."""
    runtimes = RuntimePerLoop(EngineSet().add(Embedder()), "ray", ray={"engines": {"emb": {"num_replicas": 2}}})
    assert runtimes.placed is not None
    pool = runtimes.placed.pools["emb"]
    thread = LoopThread("teola:test")
    try:

        async def first() -> tuple[tuple[str, ...], Any]:
            runtime = runtimes.current()  # the actors start on a background thread
            states = pool.states
            return states, await runtime.run(embed_one(), {"docs": ["a"]})

        states, answer = run(first())
        assert "ready" not in states and answer == {"vectors": ["A"]}  # current() did not wait for the actors

        used: list[Any] = []

        async def ask(text: str) -> Any:
            used.append(runtimes.current())
            return await used[-1].run(embed_one(), {"docs": [text]})

        from_thread = thread.run(ask("sync"))
        from_other_loop = run(ask("async"))
        assert (from_thread, from_other_loop) == ({"vectors": ["SYNC"]}, {"vectors": ["ASYNC"]})
        assert sum(pool.served) == 3  # every loop's calls went to the same pool
        run(pool.wait_ready())
        assert len({i.actor_id for i in pool.infos if i is not None}) == 2  # two actors, not two per loop
        assert used[0] is not used[1] and all(r.placed is runtimes.placed for r in used)  # a runtime per loop
    finally:
        thread.close()
        runtimes.close()
    assert pool.states == ("closed", "closed")
    # as a drop-in's sync thread after close(): used again, it starts afresh
    assert run(ask_again(runtimes)) == {"vectors": ["AGAIN"]}
    assert runtimes.placed.pools["emb"] is not pool
    runtimes.close()


async def ask_again(runtimes: RuntimePerLoop) -> Any:
    return await runtimes.current().run(embed_one(), {"docs": ["again"]})


def test_a_placement_no_node_offers_fails_fast_and_names_the_resource() -> None:
    async def main() -> None:
        runtime = RayRuntime(EngineSet().add(Embedder()), ray={"engines": {"emb": {"resources": {"nodeZ": 1}}}})
        try:
            with pytest.raises(PrimitiveError) as info:
                await runtime.run(embed_one(), {"docs": ["a"]})
            error = info.value.error
            assert isinstance(error, EngineUnavailableError)
            assert "no live Ray node offers what a replica needs (CPU=1, nodeZ=1)" in str(error)
        finally:
            await runtime.close()

    run(main(), timeout=30)  # replica_wait_s is 300: failing fast is the point


def test_an_explicit_pool_blocks_only_off_the_event_loop() -> None:
    async def main() -> None:
        with pytest.raises(RuntimeError, match=r"await RayEnginePool.create"):
            RayEnginePool(lambda: Embedder())
        pool = await RayEnginePool.create(lambda: Embedder("made-in-actor"), num_cpus=0.5)
        try:
            assert pool.name == "made-in-actor" and pool.states == ("ready",)
        finally:
            await pool.close()

    run(main())


def test_an_engine_that_cannot_build_in_its_actor_fails_its_calls_at_once() -> None:
    """No replacement loop: the factory's own error, once, for every call."""

    async def main() -> None:
        runtime = RayRuntime(EngineSet().add(BrokenInActor()), ray={"engines": {"emb": {"num_replicas": 2}}})
        try:
            for _ in range(2):
                with pytest.raises(PrimitiveError) as info:
                    await runtime.run(embed_one(), {"docs": ["a"]})
                error = info.value.error
                assert isinstance(error, EngineUnavailableError) and error.final
                assert "its engine failed to build in the actor" in str(error)
                assert "model file missing on this node" in str(error)
            assert runtime.placed.pools["emb"].states == ("lost", "lost")
        finally:
            await runtime.close()
        with pytest.raises(RuntimeError, match=r"failed in its Ray actor: .*model file missing"):
            await RayEnginePool.create(missing_model, num_cpus=0.5)

    run(main())
