"""The benchmark harness: every workload runs on every system with equal answers."""

from __future__ import annotations

import asyncio
import json
from itertools import pairwise

import pytest

from teola.cli import main
from teola_benchmarks.harness import arrival_times, bench
from teola_benchmarks.overhead import measure_overhead
from teola_benchmarks.stats import percentile, summarize
from teola_benchmarks.systems import SYSTEMS
from teola_benchmarks.workloads import WORKLOADS


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_system_gives_the_same_answers(name: str) -> None:
    # bench() raises if any system's outputs differ from the first system's.
    result = asyncio.run(bench(WORKLOADS[name], rate=50.0, queries=3, time_scale=0.002))
    assert set(result.systems) == set(SYSTEMS)
    assert all(len(r.latencies) == 3 for r in result.systems.values())
    assert result.critical_path_s > 0
    answers = result.systems["teola"].outputs
    assert all(isinstance(a["answer"], str) and a["answer"] for a in answers)


def test_json_output_has_the_documented_shape(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--workload", "naive_rag", "--queries", "2", "--rate", "20", "--time-scale", "0.002", "--json"]
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload) == {"workload", "rate", "queries", "critical_path_s", "systems"}
    assert set(payload["systems"]) == {"teola", "llamadist_po", "llamadist_to", "llamadistpc_po", "llamadistpc_to"}
    for stats in payload["systems"].values():
        assert set(stats) == {"mean_s", "p50_s", "p99_s"}
        assert stats["p50_s"] <= stats["p99_s"]


def test_sweep_writes_a_plot(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "sweep.png"
    argv = ["bench", "--workload", "naive_rag", "--queries", "2", "--rates", "10,20", "--time-scale", "0.002"]
    assert main([*argv, "--systems", "teola,llamadist_po", "--plot", str(png)]) == 0
    assert png.read_bytes().startswith(b"\x89PNG")
    assert "naive_rag at 10.0 q/s" in capsys.readouterr().out


def test_several_seeds_run_one_arrival_sequence_each(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--workload", "naive_rag", "--queries", "3", "--rate", "20", "--time-scale", "0.002"]
    assert main([*argv, "--systems", "teola", "--seeds", "0,1", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [r["seed"] for r in runs] == [0, 1]
    assert all(set(r["systems"]) == {"teola"} for r in runs)
    with pytest.raises(SystemExit, match="give one seed"):
        main([*argv, "--seeds", "0,1", "--plot", "x.png"])
    with pytest.raises(SystemExit, match="--seeds is for --workload runs"):
        main(["bench", "--agents", "--seeds", "0,1"])


def test_unknown_system_is_named() -> None:
    with pytest.raises(SystemExit, match=r"unknown system\(s\) \['nope'\]"):
        main(["bench", "--systems", "teola,nope", "--queries", "1"])


def test_overhead_counts_every_dispatched_primitive() -> None:
    result = asyncio.run(measure_overhead(WORKLOADS["advanced_rag"], queries=20))
    assert result.primitives == 20 * 22  # 22 dispatched primitives per advanced-RAG e-graph
    assert result.dispatches_per_s > 0


def test_poisson_arrivals_are_repeatable_and_have_the_rate() -> None:
    times = arrival_times(2.0, 2000, seed=1)
    assert times == arrival_times(2.0, 2000, seed=1)
    assert times[0] == 0.0 and all(b >= a for a, b in pairwise(times))
    assert 0.45 < times[-1] / len(times) < 0.55


def test_percentiles() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert summarize([1.0, 3.0]) == {"mean_s": 2.0, "p50_s": 2.0, "p99_s": pytest.approx(2.98)}
