"""The agent benchmark: trace-shaped jobs, identical answers, the JSON the issue names."""

from __future__ import annotations

import json
import statistics

import pytest

from teola.cli import main
from teola_adapters.simulated.virtual_time import run_virtual
from teola_benchmarks.agents.bench import H100_KV_TOKENS, bench_agents, features_of, system_names
from teola_benchmarks.agents.trace import TOOL_P50_S, TOOL_P90_S, Shape, make_jobs, tool_seconds
from teola_core.agents import AgentFeatures

SMALL = Shape(
    system_tokens=300,
    task_tokens=100,
    answer_tokens=40,
    result_tokens=200,
    mean_turns=5,
    compact_tokens=1500,
    summary_tokens=60,
)


def test_tool_durations_follow_the_trace_quantiles() -> None:
    import random

    rng = random.Random(7)
    samples = sorted(tool_seconds(rng) for _ in range(20_000))
    assert statistics.median(samples) == pytest.approx(TOOL_P50_S, rel=0.1)
    assert samples[int(0.9 * len(samples))] == pytest.approx(TOOL_P90_S, rel=0.15)


def test_jobs_are_repeatable_and_shaped_by_the_seed() -> None:
    assert make_jobs(6, seed=3) == make_jobs(6, seed=3)
    assert make_jobs(6, seed=3) != make_jobs(6, seed=4)
    assert all(job.model_calls >= 1 for job in make_jobs(50, seed=1))


def test_every_system_answers_like_the_plain_agent() -> None:
    # bench_agents raises if any system's answers differ from the plain agent's
    result = run_virtual(bench_agents(concurrency=6, shape=SMALL, seed=2))
    payload = result.to_json()
    assert set(payload["systems"]) == set(system_names())
    plain, teola = payload["systems"]["plain"], payload["systems"]["teola"]
    for stats in payload["systems"].values():
        assert {"mean_s", "p95_s", "recomputed_prefill_tokens", "prefix_hit_rate"} <= set(stats)
        assert stats["mean_s"] <= stats["p95_s"]
    assert teola["recomputed_prefill_tokens"] <= plain["recomputed_prefill_tokens"]
    assert 0.0 < plain["prefix_hit_rate"] < 1.0


def test_a_run_is_exactly_repeatable_in_virtual_time() -> None:
    first = run_virtual(bench_agents(concurrency=3, shape=SMALL, systems=("teola",))).to_json()
    again = run_virtual(bench_agents(concurrency=3, shape=SMALL, systems=("teola",))).to_json()
    assert first == again


def test_system_names_map_to_features() -> None:
    assert features_of("plain") is None
    assert features_of("teola") == AgentFeatures()
    assert features_of("teola+tool_cache") == AgentFeatures.only("tool_cache")
    with pytest.raises(ValueError, match="teola\\+nope"):
        features_of("teola+nope")


def test_cli_prints_the_documented_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--agents", "--concurrency", "2", "--systems", "plain,teola", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["concurrency"] == 2
    assert set(payload["systems"]) == {"plain", "teola"}
    assert set(payload["systems"]["teola"]) >= {"mean_s", "p95_s", "recomputed_prefill_tokens", "prefix_hit_rate"}


def test_cli_names_an_unknown_system() -> None:
    with pytest.raises(SystemExit, match="teola\\+fast"):
        main(["bench", "--agents", "--concurrency", "2", "--systems", "plain,teola+fast"])


def test_the_kv_pool_is_a_share_of_live_contexts_or_one_fixed_machine() -> None:
    half = run_virtual(bench_agents(concurrency=3, shape=SMALL, systems=("plain",), pool_fraction=0.5))
    whole = run_virtual(bench_agents(concurrency=3, shape=SMALL, systems=("plain",), pool_fraction=1.0))
    assert whole.kv_pool_tokens > half.kv_pool_tokens and whole.kv_pool_fraction == pytest.approx(1.0, abs=0.01)
    few, more = (
        run_virtual(bench_agents(concurrency=n, shape=SMALL, systems=("plain",), pool_tokens=4_000)) for n in (2, 4)
    )
    assert few.kv_pool_tokens == more.kv_pool_tokens == 4_000 and more.kv_pool_fraction < few.kv_pool_fraction


def test_cli_takes_a_fixed_pool_or_a_share(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--agents", "--concurrency", "2", "--systems", "plain", "--json"]
    assert main([*argv, "--kv-pool-tokens", "h100"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_pool_tokens"] == H100_KV_TOKENS == 491_520
    assert main([*argv, "--kv-pool", "1.0"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_pool_fraction"] >= 1.0  # two agents: the floor, a long call
    with pytest.raises(SystemExit, match="not both"):
        main([*argv, "--kv-pool", "0.5", "--kv-pool-tokens", "h100"])
