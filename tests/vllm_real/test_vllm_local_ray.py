"""VLLMLocalEngine on the Ray backend: the engine built inside a Ray actor from a
`VLLMLocalFactory`, driven by `RayRuntime` / `RayEnginePool` (vllm-cpu, SmolLM2-135M).

Skipped unless `vllm` and `ray` are importable and the model folder exists (see
test_vllm_local.py). Its own module, after test_vllm_local.py: that module's engine is shut
down before this one starts in the actor (one vLLM at a time on 2 cores). It shows, through
Ray, what test_vllm_local.py shows in-process:

- an optimized graph (PARTIAL_PREFILL -> FULL_PREFILL -> DECODE) run by `RayRuntime`: the
  full request hits the warm-up's blocks (the actor's engine stats), and its greedy text
  equals a cold PREFILL -> DECODE of the same prompt;
- a streamed PARTIAL_DECODE yields items, through the actor's streaming generator, before
  the call ends; its KV handle routes it to the actor that holds the prompt;
- a killed actor: its stream fails naming it, and the pool replaces it from the factory
  (the next query waits for the new vLLM and answers the same greedy text).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (scripts/vllm-cpu/setup.sh makes a venv with it)")
ray = pytest.importorskip("ray", reason="ray is not installed in this venv (scripts/vllm-cpu/run-tests.sh adds it)")

from vllm_local_support import (  # noqa: E402
    CPU_ENV,
    ENGINE,
    ENGINE_ARGS,
    LIST_PROMPT,
    MODEL_DIR,
    QUESTION,
    K,
    fresh_prefix,
    model_missing,
    node,
    run,
)

from teola_adapters.vllm_local import VLLMLocalFactory  # noqa: E402
from teola_core.engines.protocol import Call, EngineSet  # noqa: E402
from teola_core.ir.builder import GraphBuilder, Value  # noqa: E402
from teola_core.ir.graph import Graph  # noqa: E402
from teola_core.ir.node import DecodePart, Node  # noqa: E402
from teola_core.ir.split_units import Lines  # noqa: E402
from teola_core.ir.types import PortType  # noqa: E402
from teola_core.runtime.ray import RayRuntime  # noqa: E402
from teola_core.runtime.ray.kv_pins import PinnedToken  # noqa: E402
from teola_core.runtime.ray.pool import RayEnginePool  # noqa: E402

pytestmark = pytest.mark.skipif(model_missing() is not None, reason=model_missing() or "")


@pytest.fixture(scope="module")
def pool() -> Any:
    """A local Ray cluster and one actor running the engine (built there by the factory)."""
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    began = time.perf_counter()
    factory = VLLMLocalFactory(str(MODEL_DIR), name=ENGINE, env=CPU_ENV, **ENGINE_ARGS)
    engines = RayEnginePool(factory, num_cpus=2, replica_wait_s=900)  # vLLM loads for minutes on a busy CPU
    ready = time.perf_counter() - began
    print(f"\n[start] vLLM ready in its Ray actor (pid {engines.infos[0].pid}) after {ready:.1f}s")
    try:
        yield engines
    finally:
        try:
            run(engines.close(), timeout=120)
        finally:
            if started:
                ray.shutdown()


def engine_state(engines: RayEnginePool) -> dict[str, Any]:
    """The actor's engine stats and block size (read in the actor: `__ray_call__`)."""
    read = lambda actor: {"stats": asdict(actor._engine.stats), "block": actor._engine.block_size}  # noqa: E731
    return ray.get(engines.actors[0].__ray_call__.remote(read))


def delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, int]:
    return {k: after["stats"][k] - before["stats"][k] for k in after["stats"]}


def llm_node(builder: GraphBuilder, kind: K, inputs: dict[str, Any], **config: Any) -> Node:
    return builder.add(kind, inputs, engine=ENGINE, config=config, output_ports=node(kind).outputs)


def optimized_graph(max_tokens: int) -> Graph:
    """PARTIAL_PREFILL(prefix) -> FULL_PREFILL(prompt) -> DECODE: what prefill split makes."""
    b = GraphBuilder("optimized")
    prefix, prompt = b.input("prefix", PortType.PROMPT), b.input("prompt", PortType.PROMPT)
    warm = llm_node(b, K.PARTIAL_PREFILL, {"prefix": prefix})
    full = llm_node(b, K.FULL_PREFILL, {"prompt": prompt, "prefix_kv": Value(warm.id, "kv")})
    decode = llm_node(b, K.DECODE, {"kv": Value(full.id, "kv")}, max_tokens=max_tokens)
    b.output(text=Value(decode.id, "text"))
    return b.build()


def plain_graph(max_tokens: int, cache_salt: str) -> Graph:
    """PREFILL -> DECODE, computed cold: a cache salt of its own keeps it from any cached block."""
    b = GraphBuilder("plain")
    pre = llm_node(b, K.PREFILL, {"prompt": b.input("prompt", PortType.PROMPT)})
    decode = llm_node(b, K.DECODE, {"kv": Value(pre.id, "kv")}, max_tokens=max_tokens, cache_salt=cache_salt)
    b.output(text=Value(decode.id, "text"))
    return b.build()


def test_ray_runtime_runs_the_optimized_graph_with_a_warm_prefix(pool: RayEnginePool) -> None:
    prefix = fresh_prefix()
    prompt = prefix + QUESTION
    max_tokens = 32

    async def main() -> tuple[str, str, dict[str, Any], dict[str, Any], dict[str, Any]]:
        runtime = RayRuntime(EngineSet().add(pool))  # reuses this process's Ray connection
        try:
            s0 = engine_state(pool)
            optimized = await runtime.run(optimized_graph(max_tokens), {"prefix": prefix, "prompt": prompt})
            s1 = engine_state(pool)
            plain = await runtime.run(plain_graph(max_tokens, uuid.uuid4().hex), {"prompt": prompt})
            s2 = engine_state(pool)
            return optimized["text"], plain["text"], s1, delta(s1, s0), delta(s2, s1)
        finally:
            await runtime.close()

    text_optimized, text_plain, state, warm_run, cold_run = run(main())
    block = state["block"]
    print(f"\n[ray] optimized run {warm_run}; cold plain run {cold_run}; text {text_optimized!r}")
    assert warm_run["warmups"] == 1 and warm_run["warm_tokens"] >= 2 * block
    assert warm_run["prefix_cache_hits"] >= warm_run["warm_tokens"]  # the full request found every warmed block
    assert warm_run["decode_cached_tokens"] >= warm_run["warm_tokens"]
    assert cold_run["decode_cached_tokens"] == 0 and cold_run["prefix_cache_hits"] < block  # the reference ran cold
    assert text_optimized.strip(), "the model generated nothing"
    assert text_optimized == text_plain


def test_streamed_partial_decode_through_the_actor_delivers_items_early(pool: RayEnginePool) -> None:
    decode = node(K.PARTIAL_DECODE, split_unit=Lines(), max_tokens=48, part=DecodePart("g", 0, 1))

    async def main() -> tuple[list[tuple[float, str]], float, str, Any]:
        [pre] = await pool.run([Call("q", node(K.PREFILL), {"prompt": LIST_PROMPT})])
        assert not isinstance(pre, BaseException)
        parser = Lines().parser()
        timed_items: list[tuple[float, str]] = []
        deltas: list[str] = []
        began = time.perf_counter()
        async for piece in pool.stream(Call("q", decode, {"kv": pre["kv"]})):
            deltas.append(piece)
            now = time.perf_counter() - began
            timed_items += [(now, item) for item in parser.feed(piece)]
        ended = time.perf_counter() - began
        timed_items += [(ended, item) for item in parser.close()]
        return timed_items, ended, "".join(deltas), pre["kv"]

    timed_items, ended, text, kv = run(main())
    first = timed_items[0][0] if timed_items else float("nan")
    print(f"\n[ray stream] {len(timed_items)} items; first item at {first:.3f}s, call ended at {ended:.3f}s")
    assert isinstance(kv.token, PinnedToken) and kv.token.slot == 0  # the handle names the actor holding the prompt
    assert len(timed_items) >= 3, text
    assert [item for _, item in timed_items] == Lines().parse(text)
    assert sum(1 for t, _ in timed_items if t < ended) >= 2  # several items before the call ended


def test_a_killed_vllm_actor_fails_its_stream_and_is_replaced(pool: RayEnginePool) -> None:
    """Last in the module (it replaces the fixture's actor). A stream that has yielded fails
    naming the lost actor; the next query waits for the replacement vLLM and answers the same."""
    from teola_core.runtime.ray.pool import EngineActorError

    decode = node(K.DECODE, max_tokens=24)
    prompt = fresh_prefix() + QUESTION

    async def answer() -> str:
        [pre] = await pool.run([Call("q", node(K.PREFILL), {"prompt": prompt})])
        assert not isinstance(pre, BaseException)
        [out] = await pool.run([Call("q", decode, {"kv": pre["kv"]})])
        assert not isinstance(out, BaseException), out
        return out["text"]

    async def main() -> tuple[str, str, Any, Any, float]:
        before = await answer()
        [pre] = await pool.run([Call("q", node(K.PREFILL), {"prompt": prompt})])
        lost = pool.infos[0]
        stream = pool.stream(Call("q", decode, {"kv": pre["kv"]}))
        await anext(stream)  # the decode is running in the actor
        ray.kill(pool.actors[0], no_restart=True)
        try:
            async for _ in stream:
                pass
        except EngineActorError as exc:
            error: Any = exc
        began = time.perf_counter()
        after = await answer()  # waits (bounded by replica_wait_s) for the replacement to load vLLM
        return before, after, error, lost, time.perf_counter() - began

    before, after, error, lost, waited = run(main(), timeout=900)
    print(f"\n[ray kill] the next query waited {waited:.1f}s for the replacement vLLM; text {after!r}")
    assert isinstance(error, EngineActorError) and "after its first deltas" in str(error) and error.actor == lost
    assert error.actor.actor_id in str(error) and f"pid {error.actor.pid}" in str(error)
    assert pool.infos[0] is not None and pool.infos[0].actor_id != error.actor.actor_id
    assert after == before  # greedy text of the replacement equals the lost actor's
