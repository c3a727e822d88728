"""`--engines local-real`: a workload on the real embedded engines gives equal answers."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("sentence_transformers")
pytest.importorskip("pgvector")

from teola_benchmarks.harness import run_bench
from teola_benchmarks.real_engines import real_engines
from teola_benchmarks.workloads import WORKLOADS

pytestmark = pytest.mark.llamacpp  # a native crash fails these tests by name (tests/conftest.py)


def test_naive_rag_on_real_engines_equal_answers_across_systems() -> None:
    # bench() raises if any system's answers differ from the first system's.
    result = run_bench(
        WORKLOADS["naive_rag"],
        clock="real",
        rate=5.0,
        queries=1,
        systems=("teola", "async_parallel", "llamadist_po"),
        make_engines=real_engines,
    )
    assert result.critical_path_s > 0
    answer = result.runs[0]["teola"].outputs[0]["answer"]
    assert isinstance(answer, str) and answer.strip()


def test_real_engines_refuse_a_time_scale() -> None:
    with pytest.raises(ValueError, match="time scale must be 1"):
        real_engines(0.1, True, WORKLOADS["naive_rag"].model)
