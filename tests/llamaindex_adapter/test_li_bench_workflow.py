"""`teola bench --llamaindex drafts_workflow` (llama-index-core 0.14): a Workflow, both systems
run, answers agree, and Teola watches the server's load.

Small runs on the simulated vLLM-like server (fast time scale): the point is the wiring
(same inputs, answers checked equal, the JSON shape, `--max-num-seqs` reaching the
server), not the figures.
"""

from __future__ import annotations

import json

import pytest
from llama_index.core import __version__ as li_version

pytestmark = pytest.mark.skipif(
    tuple(int(p) for p in li_version.split(".")[:2]) < (0, 13), reason="Workflows are benched on the 0.14 line"
)
pytest.importorskip("llama_index.llms.openai_like")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")

from teola.cli import main  # noqa: E402
from teola_benchmarks.app_names import LLAMAINDEX_EXAMPLES, LLAMAINDEX_WORKFLOWS  # noqa: E402
from teola_benchmarks.llamaindex.bench import bench_llamaindex  # noqa: E402
from teola_benchmarks.llamaindex.workflows import WORKFLOWS  # noqa: E402


def test_bench_drafts_workflow_answers_agree_on_a_bounded_server() -> None:
    result = bench_llamaindex("drafts_workflow", queries=4, concurrency=4, time_scale=0.05, max_num_seqs=2)
    out = result.to_json()
    assert out["example"] == "drafts_workflow" and (out["queries"], out["concurrency"]) == (4, 4)
    assert set(out["systems"]) == {"llamaindex", "teola"}
    for stats in out["systems"].values():
        assert set(stats) == {"mean_s", "p50_s", "p99_s"} and stats["mean_s"] > 0
    assert set(out["speedup_vs"]) == {"llamaindex"}
    server = out["server"]
    # per system: the warm-up twice (untimed, then alone) and 4 questions, each three drafts and a summary
    assert server["requests"]["completions"] == 2 * (2 + 4) * 4
    assert server["max_num_seqs"] == 2 and set(server["alone_s"]) == {"llamaindex", "teola"}
    (watch,) = server["teola_load_watch"]  # the OpenAILike client's server, learned from /metrics
    assert watch["vllm"] is True and watch["capacity"] == 2 and watch["held_total"] > 0


def test_a_server_with_room_is_watched_but_nothing_waits_there() -> None:
    result = bench_llamaindex("drafts_workflow", queries=2, concurrency=2, time_scale=0.02)
    server = result.to_json()["server"]
    assert server["max_num_seqs"] is None
    (watch,) = server["teola_load_watch"]
    assert watch["vllm"] is True and watch["capacity"] is None


def test_cli_llamaindex_workflow_json_with_max_num_seqs(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "--llamaindex", "drafts_workflow", "--json", "--queries", "2", "--concurrency", "2"]
    code = main([*args, "--time-scale", "0.02", "--max-num-seqs", "1"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["example"] == "drafts_workflow" and set(out["systems"]) == {"llamaindex", "teola"}
    assert out["server"]["max_num_seqs"] == 1


def test_the_cli_lists_the_example_workflows() -> None:
    assert set(WORKFLOWS) == set(LLAMAINDEX_WORKFLOWS) <= set(LLAMAINDEX_EXAMPLES)
