"""Rerank pre-scoring takes only idle reranker time: with a reranker slower than the
profile the pass planned with (`--misprofiled`), Teola still beats every baseline (the
pieces it cannot fit are given up, their candidates reranked as usual). Before the
pieces were speculative, a reranker 1.3x slower than profiled made Teola 6 % slower than
`async_parallel_langchain` and 1.6x slower 72 % slower (seeds 0 and 1). Virtual clock:
exact runs."""

from __future__ import annotations

import json

import pytest

from teola.cli import main
from teola_benchmarks.harness import run_bench
from teola_benchmarks.systems import BASELINES
from teola_benchmarks.what_if import OpChange, misprofiled
from teola_benchmarks.workloads import WORKLOADS


@pytest.mark.parametrize("factor", [1.3, 1.6])
def test_a_reranker_slower_than_its_profile_costs_teola_its_lead_not_more(factor: float) -> None:
    engines, planned = misprofiled([OpChange("reranker", "rerank", factor)])
    systems = ("teola", *(b for b in BASELINES if b.startswith("async_parallel")))
    result = run_bench(
        WORKLOADS["advanced_rag"],
        rate=0.5,
        queries=40,
        systems=systems,
        seeds=(0, 1),
        make_engines=engines,
        planned_profiles=planned,
    )
    teola = result.summary("teola")["mean_s"]
    best = min(result.summary(b)["mean_s"] for b in systems[1:])
    assert teola < best / 1.05, f"teola {teola:.3f} s against the best baseline's {best:.3f} s"


def test_the_cli_runs_every_system_on_the_misprofiled_engines(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--workload", "advanced_rag", "--queries", "6", "--systems", "teola,async_parallel", "--json"]
    assert main(argv) == 0
    right = json.loads(capsys.readouterr().out)["systems"]
    assert main([*argv, "--misprofiled", "reranker.rerank=1.6"]) == 0
    stale = json.loads(capsys.readouterr().out)["systems"]
    assert stale["async_parallel"]["mean_s"] > right["async_parallel"]["mean_s"]  # its reranker is slower too
    with pytest.raises(SystemExit, match=r"--misprofiled: 'reranker\.rerank=fast': the factor 'fast' is not a number"):
        main([*argv, "--misprofiled", "reranker.rerank=fast"])
    with pytest.raises(SystemExit, match="--misprofiled is for --workload runs"):
        main(["bench", "--agents", "--misprofiled", "reranker.rerank=2"])
