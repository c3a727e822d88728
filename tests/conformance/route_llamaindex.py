"""Pytest plugin for LlamaIndex's own tests: route top-level query engines and pipelines through Teola.

`BaseQueryEngine.query`/`aquery` (and `CustomQueryEngine`'s own) and, on llama-index-core
0.12, every `QueryPipeline.run*`/`arun*` go to `teola.optimize(obj)`; see `routing.py`
and `run.py`.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.query_engine import CustomQueryEngine
from routing import flush, route, set_current_test

import teola

ENGINE_METHODS = ("query", "aquery")
PIPELINE_METHODS = (
    "run",
    "arun",
    "run_with_intermediates",
    "arun_with_intermediates",
    "run_multi",
    "arun_multi",
    "run_multi_with_intermediates",
    "arun_multi_with_intermediates",
)


def pytest_configure(config: Any) -> None:
    route((BaseQueryEngine, CustomQueryEngine), ENGINE_METHODS, teola.optimize)
    if importlib.util.find_spec("llama_index.core.query_pipeline") is not None:  # gone from 0.13
        from llama_index.core.query_pipeline import QueryPipeline

        route((QueryPipeline,), PIPELINE_METHODS, teola.optimize)


def pytest_runtest_setup(item: Any) -> None:
    set_current_test(item.nodeid)


def pytest_sessionfinish(session: Any) -> None:
    flush()
