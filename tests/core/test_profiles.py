"""Profiles interpolate, find the max efficient batch and round-trip through files."""

from __future__ import annotations

import pytest

from teola_core.profiles.profile import Curve, LatencyProfile


def test_curve_interpolates_and_extrapolates() -> None:
    c = Curve(((1, 0.1), (4, 0.15), (16, 0.45)))
    assert c.latency(4) == pytest.approx(0.15)
    assert c.latency(10) == pytest.approx(0.30)
    assert c.latency(28) == pytest.approx(0.75)  # slope of the last segment
    assert c.latency(0.5) == pytest.approx(0.1)


def test_max_efficient_batch_is_where_throughput_stops_growing() -> None:
    # DESIGN.md: 48 chunks at batch 4 -> 1.8 s (0.15 s/batch), at batch 16 -> 1.35 s (0.45 s/batch).
    p = LatencyProfile("embedder", {"embed": Curve(((1, 0.1), (4, 0.15), (16, 0.45), (32, 0.9), (64, 1.8)))})
    assert p.max_efficient_batch("embed") == 16
    # MiniLM measured here: 1 -> 10 ms, 16 -> 36 ms, 64 -> 134 ms.
    minilm = LatencyProfile("minilm", {"embed": Curve(((1, 0.010), (16, 0.036), (64, 0.134)))})
    assert minilm.max_efficient_batch("embed") == 16


def test_profile_round_trips_through_a_file(tmp_path) -> None:
    p = LatencyProfile("llm", {"prefill": Curve(((1, 0.01), (512, 0.2))), "decode": Curve(((1, 0.03), (32, 0.04)))})
    path = tmp_path / "llm.json"
    p.save(path)
    loaded = LatencyProfile.load(path)
    assert loaded == p
    assert loaded.scaled(0.5).latency("decode", 1) == pytest.approx(0.015)


def test_unknown_curve_is_named() -> None:
    with pytest.raises(KeyError, match="engine 'x' has no curve 'search'"):
        LatencyProfile("x", {}).latency("search", 1)
