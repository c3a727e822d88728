"""`teola bench --langgraph`: the JSON shape, equal answers, the server's bound on running requests."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("langchain_openai")
pytest.importorskip("uvicorn")

from teola.cli import main
from teola_adapters.simulated.servers import SimServers
from teola_benchmarks.langgraph.bench import SYSTEMS
from teola_examples.common import openai_models


@pytest.mark.parametrize("example", ["rag", "map_reduce"])
def test_langgraph_bench_json_shape(example: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--langgraph", example, "--json", "--queries", "2", "--concurrency", "2", "--time-scale", "0.01"]
    assert main([*argv, "--max-num-seqs", "3"]) == 0  # raises AnswerMismatch if the answers differ
    out = json.loads(capsys.readouterr().out)
    assert out["example"] == example and set(out["systems"]) == set(SYSTEMS)
    assert set(out["speedup_vs"]) == {"langgraph"}
    assert out["server"]["max_num_seqs"] == 3 and out["server"]["teola_options"] == {}  # zero configuration
    assert set(out["server"]["alone_s"]) == set(SYSTEMS)


def test_langgraph_bench_open_loop(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--langgraph", "rag", "--json", "--queries", "3", "--rate", "50", "--seed", "2"]
    assert main([*argv, "--time-scale", "0.01", "--max-num-seqs", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["server"]["arrivals"] == {"poisson_rate": 50.0, "seed": 2}
    assert set(out["systems"]) == set(SYSTEMS)
    with pytest.raises(SystemExit, match=r"--rate \(open loop\) or --concurrency"):
        main(["bench", "--langgraph", "rag", "--rate", "1", "--concurrency", "2"])


def test_max_num_seqs_is_checked() -> None:
    with pytest.raises(SystemExit, match="--max-num-seqs is for --langgraph, --langchain EXAMPLE and --llamaindex"):
        main(["bench", "--langchain", "all", "--max-num-seqs", "2"])
    with pytest.raises(SystemExit, match="--max-num-seqs must be >= 1"):
        main(["bench", "--langgraph", "rag", "--max-num-seqs", "0"])


def test_the_server_runs_at_most_max_num_seqs_requests() -> None:
    with SimServers(time_scale=0.01, max_num_seqs=1) as servers:
        llm, _ = openai_models(servers.base_url, max_tokens=16)

        async def ask() -> list[object]:
            return list(await asyncio.gather(*(llm.ainvoke(f"question {i}") for i in range(4))))

        answers = asyncio.run(ask())
    assert len(answers) == 4
    assert servers.backend.llm.stats.max_running == 1  # four requests at once, one decoding at a time


def test_the_burst_on_a_server_of_your_own_reports_both_rounds(capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m teola_benchmarks.langgraph.on_server URL`, here against the simulated vLLM-like
    server (what it runs against a real vLLM): equal answers, what Teola learned, both ratios."""
    from teola_benchmarks.langgraph.on_server import ROUNDS
    from teola_benchmarks.langgraph.on_server import main as on_server

    with SimServers(time_scale=0.01, max_num_seqs=2) as servers:
        assert on_server([servers.root_url, "--model", "sim", "--runs", "4", "--documents", "10"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["systems"]) == set(ROUNDS) and out["runs"] == 4 and out["prefix_cache_emptied_between_rounds"]
    assert out["mean_speedup_first_contact"] > 0 and out["mean_speedup_bound_known"] > 0
    (learned,) = out["teola_learned"]
    assert "vLLM-like; runs 2 at once" in learned
    with pytest.raises(SystemExit, match="--runs and --documents must be >= 1"):
        on_server(["http://127.0.0.1:9", "--runs", "0"])


def test_create_agents_bench_json_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--langgraph", "create_agents", "--concurrency", "3", "--time-scale", "0.01", "--seed", "1"]
    assert main([*argv, "--json"]) == 0  # raises AnswerMismatch if the answers differ
    out = json.loads(capsys.readouterr().out)
    assert out["agents"] == 3 and out["seed"] == 1 and set(out["systems"]) == {"langgraph", "teola"}
    assert {"mean_s", "p95_s", "recomputed_prefill_tokens"} <= set(out["systems"]["teola"])
    with pytest.raises(SystemExit, match="create_agents takes --concurrency, --seed and --time-scale"):
        main(["bench", "--langgraph", "create_agents", "--rate", "1"])


def test_agents_on_a_server_of_your_own_call_the_traced_tools(capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m teola_benchmarks.langgraph.agents_on_server URL`, here against the simulated
    vLLM-like server with no script of its own: the client's transport puts the trace's tool
    calls into the answers, so every traced model call is made, by both systems, answers equal."""
    from teola_benchmarks.langgraph.agents_on_server import main as agents_on_server

    with SimServers(time_scale=0.01, kv_cache_tokens=4096) as servers:
        argv = [servers.root_url, "--model", "sim", "--agents", "3", "--tool-time", "0.001", "--seed", "1"]
        assert agents_on_server([*argv, "--middleware"]) == 0  # raises AnswerMismatch if the answers differ
    out = json.loads(capsys.readouterr().out)
    assert out["model_calls"] > 3  # the jobs call tools
    made = out["model_calls"]
    assert out["model_calls_made"] == {"langgraph": made, "teola": made, "teola_middleware": made}
    assert out["server_kv_tokens"] == 4096 and set(out["systems"]) == {"langgraph", "teola", "teola_middleware"}
    assert out["live_context_tokens"] > 0 and out["kv_share_of_live"] == pytest.approx(
        4096 / out["live_context_tokens"], 0.01
    )
    with pytest.raises(SystemExit):
        agents_on_server(["http://127.0.0.1:9", "--model", "m", "--agents", "0"])
