"""The profiler recovers a simulated engine's curve and its max efficient batch."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from teola_adapters.simulated import SimEmbedder, SimLLM, run_virtual
from teola_adapters.simulated.paper_profiles import EMBEDDER, LLM
from teola_core.engines.protocol import Call
from teola_core.ir.kinds import PortSpec, PrimitiveKind, spec_of
from teola_core.ir.node import Node
from teola_core.ir.types import KVHandle, PortType
from teola_core.profiles.profile import Curve, LatencyProfile
from teola_core.profiles.profiler import ProfilingError, profile_engine

EMBED = Node(
    "embed",
    PrimitiveKind.EMBED,
    spec_of(PrimitiveKind.EMBED).inputs or (),
    spec_of(PrimitiveKind.EMBED).outputs or (),
    caps=spec_of(PrimitiveKind.EMBED).caps,
)


def flat(points: Sequence[tuple[float, float]]) -> list[float]:
    return [v for point in points for v in point]


def embed_calls(n: int) -> list[Call]:
    return [Call("profile", EMBED, {"texts": [f"text number {i}" for i in range(n)]})]


def test_measured_curve_has_the_simulated_max_efficient_batch() -> None:
    """Timed from outside the engine (the event loop's clock around each `run`, the engine
    sleeping its scaled latency), on the virtual-time loop: exact, and no wall time spent."""
    scale = 0.1
    engine = SimEmbedder(EMBEDDER, time_scale=scale)
    sizes = (1, 2, 4, 8, 16, 32)

    async def main() -> LatencyProfile:
        loop = asyncio.get_running_loop()
        return await profile_engine(engine, embed_calls, "embed", batch_sizes=sizes, repeats=5, clock=loop.time)

    measured = run_virtual(main())
    assert measured.max_efficient_batch("embed") == EMBEDDER.max_efficient_batch("embed") == 16
    expected = [(n, EMBEDDER.latency("embed", n) * scale) for n in sizes]
    assert flat(measured.curve("embed").points) == pytest.approx(flat(expected))


def test_an_exact_clock_recovers_the_profile_points() -> None:
    """With the engine's simulated clock, the measured curve is the profile itself."""
    engine = SimEmbedder(EMBEDDER, time_scale=0)
    sizes = (1, 2, 4, 8, 16, 32, 64)
    measured = asyncio.run(
        profile_engine(engine, embed_calls, "embed", sizes, repeats=2, clock=lambda: engine.stats.busy_s)
    )
    assert flat(measured.curve("embed").points) == pytest.approx(flat(EMBEDDER.curve("embed").points))
    assert measured.max_efficient_batch("embed") == 16


def test_profile_merges_into_an_existing_one_and_saves(tmp_path: Path) -> None:
    engine = SimEmbedder(EMBEDDER, time_scale=0)
    base = LatencyProfile("embedder", {"other": Curve(((1, 1.0),)), "embed": Curve(((1, 9.0),))})
    path = tmp_path / "embedder.json"
    profile = asyncio.run(
        profile_engine(
            engine, embed_calls, "embed", (1, 4), repeats=1, clock=lambda: engine.stats.busy_s, into=base, save_to=path
        )
    )
    assert profile.curve("other") == base.curve("other")
    assert flat(profile.curve("embed").points) == pytest.approx([1.0, 0.10, 4.0, 0.15])
    assert LatencyProfile.load(path).to_json() == profile.to_json()


def test_async_call_factories_profile_an_llm_decode_step() -> None:
    decode = Node(
        "decode",
        PrimitiveKind.DECODE,
        (PortSpec("kv", PortType.KV),),
        (PortSpec("text", PortType.TEXT),),
        config={"max_tokens": 1},
    )
    engine = SimLLM(LLM, time_scale=0)

    async def decode_calls(n: int) -> Sequence[Call]:
        return [Call("profile", decode, {"kv": KVHandle("llm", f"prompt {i}")}) for i in range(n)]

    profile = asyncio.run(
        profile_engine(engine, decode_calls, "decode", (1, 8, 64), repeats=1, clock=lambda: engine.stats.busy_s)
    )
    expected = [(float(n), LLM.latency("decode", n)) for n in (1, 8, 64)]
    assert flat(profile.curve("decode").points) == pytest.approx(flat(expected))
    assert profile.curve("prefill") == LLM.curve("prefill")  # merged into the engine's own profile


def test_a_failing_call_is_an_error_not_a_latency() -> None:
    engine = SimEmbedder(EMBEDDER, time_scale=0)
    with pytest.raises(ProfilingError, match="embed"):
        asyncio.run(profile_engine(engine, lambda n: [Call("p", EMBED, {})], "embed", (1,), repeats=1))
    with pytest.raises(ValueError, match="repeats"):
        asyncio.run(profile_engine(engine, embed_calls, "embed", (1,), repeats=0))
