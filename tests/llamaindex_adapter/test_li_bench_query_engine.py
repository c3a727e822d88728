"""`teola bench --llamaindex fusion_query_engine` (llama-index-core 0.12 and 0.14): answers agree.

A small run on the simulated servers (fast time scale): the wiring, not the figures.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")

from teola.cli import main

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_fusion_query_engine_bench_answers_agree(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--llamaindex", "fusion_query_engine", "--json", "--queries", "3", "--concurrency", "2"]
    assert main([*argv, "--time-scale", "0.05"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["example"] == "fusion_query_engine" and set(out["systems"]) == {"llamaindex", "teola"}
    # per system: the warm-up twice (untimed, then alone) and 3 questions, each a generation and an answer
    assert out["server"]["requests"]["completions"] == 2 * (2 + 3) * 2
    assert set(out["server"]["alone_s"]) == {"llamaindex", "teola"}


def test_a_query_pipeline_example_on_a_line_without_query_pipelines_says_why() -> None:
    import importlib.util

    if importlib.util.find_spec("llama_index.core.query_pipeline") is not None:
        pytest.skip("this line has QueryPipeline")
    from teola_benchmarks.llamaindex.bench import bench_llamaindex

    with pytest.raises(ModuleNotFoundError, match=r"needs llama-index-core <= 0\.12"):
        bench_llamaindex("fusion_rag", queries=1, concurrency=1, time_scale=0.05)
