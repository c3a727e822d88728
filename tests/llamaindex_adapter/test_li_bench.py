"""`teola bench --llamaindex` (llama-index-core <= 0.12): both systems run, answers agree.

Small runs on the simulated OpenAI-compatible servers (fast time scale): the point is
the wiring (same inputs, answers checked equal, the JSON shape), not the figures.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llama_index.core.query_pipeline")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")

from llama_index.core.query_pipeline import QueryPipeline

from teola.cli import main
from teola_benchmarks.llamaindex.bench import bench_llamaindex
from teola_benchmarks.llamaindex.examples import multi_query_rag

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_multi_query_rag_is_traced_not_run_on_its_own_executor() -> None:
    from llama_index.core import VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.core.llms import MockLLM
    from llama_index.core.schema import TextNode

    import teola

    index = VectorStoreIndex([TextNode(text=f"t{i}") for i in range(4)], embed_model=MockEmbedding(embed_dim=4))
    pipeline = multi_query_rag(MockLLM(), index, n_queries=3)
    assert isinstance(pipeline, QueryPipeline)
    explained = teola.optimize(pipeline).explain()
    assert "own executor" not in explained
    assert explained.count("search @") >= 3


def test_bench_multi_query_rag_answers_agree() -> None:
    result = bench_llamaindex("multi_query_rag", queries=3, concurrency=2, time_scale=0.05)
    out = result.to_json()
    assert out["example"] == "multi_query_rag"
    assert set(out["systems"]) == {"llamaindex", "teola"}
    for stats in out["systems"].values():
        assert set(stats) == {"mean_s", "p50_s", "p99_s"} and stats["mean_s"] > 0
    assert out["server"]["requests"]["completions"] > 0
    assert set(out["server"]["alone_s"]) == {"llamaindex", "teola"}  # the floor of each mean


def test_cli_llamaindex_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--llamaindex", "naive_rag", "--json", "--queries", "2", "--time-scale", "0.05"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["example"] == "naive_rag" and set(out["systems"]) == {"llamaindex", "teola"}


def test_bench_fusion_rag_answers_agree_with_the_generation_streamed() -> None:
    result = bench_llamaindex("fusion_rag", queries=3, concurrency=2, time_scale=0.05)
    out = result.to_json()
    assert out["example"] == "fusion_rag" and set(out["systems"]) == {"llamaindex", "teola"}
    # per system: the warm-up twice (untimed, then alone) and 3 questions, each a generation and an answer
    assert out["server"]["requests"]["completions"] == 2 * (2 + 3) * 2


def test_the_cli_lists_exactly_the_example_pipelines_query_engines_and_workflows() -> None:
    from teola_benchmarks.app_names import LLAMAINDEX_EXAMPLES, LLAMAINDEX_WORKFLOWS
    from teola_benchmarks.llamaindex.examples import EXAMPLES
    from teola_benchmarks.llamaindex.query_engines import QUERY_ENGINES

    assert set(LLAMAINDEX_EXAMPLES) == set(EXAMPLES) | set(QUERY_ENGINES) | set(LLAMAINDEX_WORKFLOWS)
    assert len(LLAMAINDEX_EXAMPLES) == len(EXAMPLES) + len(QUERY_ENGINES) + len(LLAMAINDEX_WORKFLOWS)
