"""Actor and node loss on a real multi-node Ray cluster.

- a killed actor: its in-flight stateless call is re-sent once and answers; a call whose
  KV state lived there fails with `EngineActorError` naming that very actor; nothing sent
  after the loss fails or is re-sent; a replacement starts.
- a killed node holding one of two replicas: the same, the error naming the node.
- an engine whose only node is gone fails fast, naming what it needs, and comes back
  when a node offering it joins.

Calls are held in flight by a gate actor (no sleeps); the cluster is the session's, with
nodes added for the node-loss tests and removed by them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from ray_helpers import chat, embed_one, run  # noqa: E402
from ray_test_engines import Embedder, Gate, StatefulLLM  # noqa: E402

from teola_core.engines.protocol import EngineSet  # noqa: E402
from teola_core.ir.errors import PrimitiveError  # noqa: E402
from teola_core.runtime.ray import RayRuntime  # noqa: E402
from teola_core.runtime.ray.pool import ActorInfo, EngineActorError, EngineUnavailableError, RayEnginePool  # noqa: E402


@pytest.fixture
def gate(ray_cluster: Any) -> Iterator[Any]:
    handle = ray.remote(Gate).remote()
    yield handle
    ray.kill(handle)


def engines(gate: Any) -> EngineSet:
    return EngineSet().add(Embedder(gate=gate, concurrency=4)).add(StatefulLLM(gate=gate))


async def hold(runtime: RayRuntime, gate: Any, graph: Any, inputs: dict[str, Any], key: str) -> tuple[Any, str]:
    """Start a query and wait until its engine call is held at the gate; (task, actor id holding it)."""
    task = asyncio.ensure_future(runtime.run(graph, inputs, query_id=key))
    return task, await gate.arrived.remote(key)


def info_of(pool: RayEnginePool, actor_id: str) -> ActorInfo:
    (info,) = [i for i in pool.infos if i is not None and i.actor_id == actor_id]
    return info


async def later_queries(runtime: RayRuntime, n: int = 20) -> None:
    """`n` queries sent after the loss (half embeds, half chats): every one answers."""
    embeds = [runtime.run(embed_one(), {"docs": [f"after{i}"]}) for i in range(n // 2)]
    chats = [runtime.run(chat(), {"q": f"after{i}"}) for i in range(n // 2)]
    results = await asyncio.gather(*embeds, *chats)
    assert results[: n // 2] == [{"vectors": [f"AFTER{i}"]} for i in range(n // 2)]
    assert results[n // 2 :] == [{"answer": f"answer to Q: after{i}"} for i in range(n // 2)]


def assert_names_the_lost_actor(task: Any, info: ActorInfo, engine: str) -> None:
    with pytest.raises(PrimitiveError) as raised:
        task.result()
    error = raised.value.error
    assert isinstance(error, EngineActorError) and error.engine == engine and error.actor == info
    for part in (f"engine {engine!r}", info.actor_id, f"pid {info.pid}", f"node {info.node_id[:12]}"):
        assert part in str(error)
    assert isinstance(error.__cause__, ray.exceptions.RayActorError)


def test_a_killed_actor_fails_only_calls_that_cannot_move(gate: Any) -> None:
    options = {"engines": {"emb": {"num_replicas": 2}, "llm": {"num_replicas": 2}}}

    async def main() -> None:
        runtime = RayRuntime(engines(gate), ray=options)
        emb, llm = runtime.placed.pools["emb"], runtime.placed.pools["llm"]
        try:
            await asyncio.gather(emb.wait_ready(), llm.wait_ready())
            moving, emb_actor = await hold(runtime, gate, embed_one(), {"docs": ["block:e"]}, "e")
            bound, llm_actor = await hold(runtime, gate, chat(), {"q": "block:d"}, "d")
            emb_info, llm_info = info_of(emb, emb_actor), info_of(llm, llm_actor)
            ray.kill(emb.actors[emb_info.slot], no_restart=True)  # as if the process crashed
            ray.kill(llm.actors[llm_info.slot], no_restart=True)

            assert await moving == {"vectors": ["BLOCK:E"]}  # re-sent once, to the other replica
            visits = await gate.visits.remote("e")
            assert visits[0] == emb_actor and visits[1] != emb_actor and emb.resent == 1
            await asyncio.wait({bound})
            assert_names_the_lost_actor(bound, llm_info, "llm")  # its KV state died with the actor

            resent = (emb.resent, llm.resent)
            await later_queries(runtime)
            assert (emb.resent, llm.resent) == resent  # nothing sent after the loss went to a dead actor
            await asyncio.gather(emb.wait_ready(), llm.wait_ready())  # replacements started
            assert emb_actor not in {i.actor_id for i in emb.infos if i}
        finally:
            await runtime.close()

    run(main())


def test_losing_the_node_of_one_of_two_replicas(ray_cluster: Any, gate: Any) -> None:
    """Each engine has a replica on each of two added nodes; the first node is killed mid-run."""
    doomed = ray_cluster.add_node(num_cpus=2, resources={"embeds": 1, "chats": 1})
    survivor = ray_cluster.add_node(num_cpus=2, resources={"embeds": 1, "chats": 1})
    options = {
        "engines": {
            "emb": {"num_replicas": 2, "resources": {"embeds": 1}},
            "llm": {"num_replicas": 2, "resources": {"chats": 1}},
        }
    }

    async def main() -> None:
        runtime = RayRuntime(engines(gate), ray=options)
        emb, llm = runtime.placed.pools["emb"], runtime.placed.pools["llm"]
        try:
            await asyncio.gather(emb.wait_ready(), llm.wait_ready())
            assert {i.node_id for i in emb.infos if i} == {doomed.node_id, survivor.node_id}
            # one held call per replica: the second goes to the least-loaded replica, the other one
            held = {key: await hold(runtime, gate, embed_one(), {"docs": [f"block:{key}"]}, key) for key in "ab"}
            held |= {key: await hold(runtime, gate, chat(), {"q": f"block:{key}"}, key) for key in "cd"}
            pools = {"a": emb, "b": emb, "c": llm, "d": llm}
            infos = {key: info_of(pools[key], actor) for key, (_, actor) in held.items()}
            on_doomed = {key for key, info in infos.items() if info.node_id == doomed.node_id}
            assert len(on_doomed) == 2 and on_doomed & {"a", "b"} and on_doomed & {"c", "d"}

            killed = time.monotonic()
            ray_cluster.remove_node(doomed, allow_graceful=False)
            (embed_key,) = on_doomed & {"a", "b"}
            (chat_key,) = on_doomed & {"c", "d"}
            assert await held[embed_key][0] == {"vectors": [f"BLOCK:{embed_key.upper()}"]}  # re-sent to the survivor
            recovered = time.monotonic() - killed
            await asyncio.wait({held[chat_key][0]})
            assert_names_the_lost_actor(held[chat_key][0], infos[chat_key], "llm")
            failed = time.monotonic() - killed

            resent = (emb.resent, llm.resent)
            began = time.monotonic()
            await later_queries(runtime)
            assert (emb.resent, llm.resent) == resent
            print(
                f"\nnode killed: its in-flight embed answered (re-sent) after {recovered:.2f} s, its KV-bound decode"
                f" failed after {failed:.2f} s; 20 queries sent afterwards: all answered, none re-sent, in"
                f" {time.monotonic() - began:.2f} s"
            )
            for key in set(held) - on_doomed:  # the survivor's held calls were never disturbed
                await gate.release.remote(key)
                await held[key][0]
        finally:
            await runtime.close()

    try:
        run(main())
    finally:
        ray_cluster.remove_node(survivor, allow_graceful=False)


def test_an_engine_whose_only_node_is_gone_fails_fast_and_returns_with_a_node(ray_cluster: Any) -> None:
    solo = ray_cluster.add_node(num_cpus=1, resources={"solo": 1})
    options = {"engines": {"emb": {"resources": {"solo": 1}, "replica_wait_s": 60}}}
    replacement = None

    async def main() -> None:
        nonlocal replacement
        runtime = RayRuntime(EngineSet().add(Embedder()), ray=options)
        try:
            assert await runtime.run(embed_one(), {"docs": ["before"]}) == {"vectors": ["BEFORE"]}
            ray_cluster.remove_node(solo, allow_graceful=False)
            await asyncio.to_thread(ray_cluster.wait_for_nodes)  # Ray has declared the node dead
            began = time.monotonic()
            with pytest.raises(PrimitiveError) as raised:
                await runtime.run(embed_one(), {"docs": ["during"]})
            took = time.monotonic() - began
            error = raised.value.error
            assert isinstance(error, EngineUnavailableError)  # the placement check's verdict, at once:
            assert "replica_wait_s" not in str(error)  # not the end of waiting for a replica (60 s)
            assert "no live Ray node offers what a replica needs (CPU=1, solo=1)" in str(error)
            assert f"it ran on node {solo.node_id[:12]}" in str(error)
            print(f"\nonly node gone: the next call failed after {took:.2f} s")

            # Ray starts a node from the main thread only (signal handlers): block this loop meanwhile
            replacement = ray_cluster.add_node(num_cpus=1, resources={"solo": 1})
            assert await runtime.run(embed_one(), {"docs": ["after"]}) == {"vectors": ["AFTER"]}
        finally:
            await runtime.close()

    try:
        run(main())
    finally:
        if replacement is not None:
            ray_cluster.remove_node(replacement, allow_graceful=False)
