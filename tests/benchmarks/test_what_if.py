"""What-if runs: Teola with one op's latencies scaled, the baselines as they are."""

from __future__ import annotations

import json

import pytest

from teola.cli import main
from teola_adapters.simulated.paper_profiles import LLM, RERANKER
from teola_benchmarks.harness import run_bench
from teola_benchmarks.what_if import OpChange, what_if
from teola_benchmarks.workloads import WORKLOADS
from teola_benchmarks.workloads.naive_rag import ANSWER_TOKENS

ADVANCED = WORKLOADS["advanced_rag"]


@pytest.fixture(scope="module")
def base():
    return run_bench(ADVANCED, rate=0.5, queries=8, seeds=(0, 1), systems=("teola", "async_parallel"))


def test_an_unchanged_op_reproduces_teolas_own_run(base) -> None:
    found = what_if(base, ADVANCED, OpChange.parse("reranker.rerank=1"))
    assert found.changed.critical_path_s == pytest.approx(base.critical_path_s, abs=1e-9)
    for seed in base.seeds:
        # the same schedule, at other absolute times of the virtual loop: equal to float rounding
        assert found.changed.runs[seed]["teola"].latencies == pytest.approx(
            base.runs[seed]["teola"].latencies, abs=1e-9
        )
    assert found.vs_best() == pytest.approx(base.summary("async_parallel")["mean_s"] / base.summary("teola")["mean_s"])


def test_free_decoding_shortens_the_critical_path_and_every_query_gains(base) -> None:
    """The passes plan with the changed profile too: with free decoding the expanded queries
    are known sooner, so rerank pre-scoring no longer fits with its headroom and stays off;
    the path still loses at least the answer's decode against the path without it."""
    found = what_if(base, ADVANCED, OpChange.parse("llm.decode=0"))
    answer_decode = ANSWER_TOKENS * LLM.latency("decode", 1)  # the last step of the query's critical path
    assert found.changed.critical_path_s <= base.critical_path_s - answer_decode + 0.4  # + the rerank pre-scoring hid
    for seed in base.seeds:
        before, after = base.runs[seed]["teola"].latencies, found.changed.runs[seed]["teola"].latencies
        assert all(a < b for a, b in zip(after, before, strict=True))
    assert found.changed.runs[0]["teola"].outputs == base.runs[0]["teola"].outputs  # time changed, not answers
    payload = found.to_json()
    assert payload["change"] == "llm.decode=0" and payload["best_baseline"] == "async_parallel"
    assert payload["vs_best"]["mean"] > base.summary("async_parallel")["mean_s"] / base.summary("teola")["mean_s"]


def test_one_ops_curve_is_scaled_and_the_others_kept() -> None:
    profile = RERANKER.with_op_scaled("rerank", 0.5)
    assert profile.latency("rerank", 12) == pytest.approx(RERANKER.latency("rerank", 12) / 2)
    with pytest.raises(ValueError, match=">= 0"):
        RERANKER.with_op_scaled("rerank", -1)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("reranker.rerank", "expected ENGINE.OP=FACTOR"),
        ("reranker=0", "expected ENGINE.OP=FACTOR"),
        ("gpu.rerank=0", "no engine 'gpu' (known: embedder, llm, reranker, vectordb)"),
        ("reranker.embed=0", "engine 'reranker' has no op 'embed' (known: rerank)"),
        ("reranker.rerank=fast", "the factor 'fast' is not a number"),
        ("reranker.rerank=-0.5", "must be >= 0"),
    ],
)
def test_a_bad_change_names_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        OpChange.parse(text)


def test_an_op_the_workload_never_runs_is_refused_before_any_run() -> None:
    with pytest.raises(ValueError, match="workload 'naive_rag' runs no rerank on 'reranker'"):
        OpChange.parse("reranker.rerank=0").check(WORKLOADS["naive_rag"])


def test_cli_adds_the_what_if_runs_to_the_json(capsys) -> None:
    argv = ["bench", "--workload", "advanced_rag", "--queries", "4", "--systems", "teola,async_parallel"]
    assert main([*argv, "--what-if", "reranker.rerank=0", "--what-if", "embedder.embed=0.9", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [w["change"] for w in payload["what_if"]] == ["reranker.rerank=0", "embedder.embed=0.9"]
    assert all(w["vs_best"]["mean"] > 0 and w["teola"]["mean_s"] > 0 for w in payload["what_if"])
    with pytest.raises(SystemExit, match="virtual clock"):
        main([*argv, "--clock", "real", "--what-if", "reranker.rerank=0"])
    with pytest.raises(SystemExit, match="is for --workload runs"):
        main(["bench", "--agents", "--what-if", "reranker.rerank=0"])
