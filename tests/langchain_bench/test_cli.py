"""`teola bench --langchain`: the JSON shapes, and a mismatch between systems is an error."""

from __future__ import annotations

import json

import pytest

from teola.cli import main
from teola_benchmarks.framework_result import AnswerMismatch, check_equal
from teola_benchmarks.langchain.bench import SYSTEMS


def test_langchain_bench_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "bench",
        "--langchain",
        "naive_rag",
        "--json",
        "--queries",
        "3",
        "--concurrency",
        "2",
        "--time-scale",
        "0.01",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["example"] == "naive_rag"
    assert set(out["systems"]) == set(SYSTEMS)
    for stats in out["systems"].values():
        assert set(stats) == {"mean_s", "p50_s", "p99_s"}
        assert all(v > 0 for v in stats.values())
    assert set(out["speedup_vs"]) == {"langchain", "langchain_abatch"}
    assert (out["queries"], out["concurrency"], out["time_scale"]) == (3, 2, 0.01)
    assert set(out["server"]["alone_s"]) == set(SYSTEMS)  # each system's one query alone: its mean's floor


def test_langchain_overhead_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--langchain", "assign_pipeline", "--overhead", "--json", "--queries", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "overhead"
    assert set(out["systems"]) == {"langchain", "teola"}
    assert out["ratio"] == pytest.approx(out["systems"]["teola"]["mean_s"] / out["systems"]["langchain"]["mean_s"])


def test_unequal_answers_raise() -> None:
    answers = {"langchain": ["a", "b"], "langchain_abatch": ["a", "b"], "teola": ["a", "c"]}
    with pytest.raises(AnswerMismatch, match="teola answered 'c'"):
        check_equal("x", [{"q": 1}, {"q": 2}], answers, "langchain")


def test_unknown_example_is_refused() -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--langchain", "nope"])


def test_every_plain_spelling_runs_beside_the_chain(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--langchain", "assign_pipeline", "--json", "--queries", "2", "--concurrency", "2"]
    assert main([*argv, "--time-scale", "0.01"]) == 0
    out = json.loads(capsys.readouterr().out)
    # the chained `.assign`s and one `.assign(a=..., b=..., c=...)`: answers equal (else AnswerMismatch)
    assert set(out["systems"]) == {*SYSTEMS, "langchain_one_assign"}
    plain = {name: s["mean_s"] for name, s in out["systems"].items() if name != "teola"}
    assert out["best_baseline"] == min(plain, key=plain.__getitem__)


def test_call_overhead_covers_both_chains_and_every_method(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--call-overhead", "--json", "--queries", "8"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {(r["chain"], r["method"]): r for r in out["rows"]}
    methods = ("invoke", "ainvoke", "batch", "abatch")
    assert set(rows) == {(c, m) for c in ("ten_lambdas", "prompt_model_parser") for m in methods}
    assert all(r["langchain_us"] > 0 and r["teola_us"] > 0 for r in rows.values())
