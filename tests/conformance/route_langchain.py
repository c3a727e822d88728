"""Pytest plugin for LangChain's runnables suite: route composed runnables through Teola.

Top-level calls of `RunnableSequence`, `RunnableParallel`, `RunnableAssign` and
`RunnableBranch` (invoke, ainvoke, batch, abatch, stream, astream, astream_events,
astream_log) go to `teola.optimize(obj)`; see `routing.py` and `run.py`.
"""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableBranch, RunnableParallel, RunnableSequence
from langchain_core.runnables.passthrough import RunnableAssign
from routing import flush, route, set_current_test

import teola
import teola_langchain.components.patched  # noqa: F401 - records LangChain's own methods before they are routed

CLASSES = (RunnableSequence, RunnableParallel, RunnableAssign, RunnableBranch)
METHODS = ("invoke", "ainvoke", "batch", "abatch", "stream", "astream", "astream_events", "astream_log")


def pytest_configure(config: Any) -> None:
    route(CLASSES, METHODS, teola.optimize)


def pytest_runtest_setup(item: Any) -> None:
    set_current_test(item.nodeid)


def pytest_sessionfinish(session: Any) -> None:
    flush()
