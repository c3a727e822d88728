"""Pytest plugin for LangGraph's own suite: route top-level runs of compiled graphs through Teola.

Every way a user runs a compiled graph (`Pregel` and its subclasses, `CompiledStateGraph`
included): invoke, ainvoke, stream, astream, batch, abatch, batch_as_completed,
abatch_as_completed, stream_events, astream_events, astream_log; each goes to
`teola.optimize(graph)`'s method of that name (see `routing.py`). The optimized graph is
a copy of the graph's own class, so calls inside a routed call (its `invoke` calling its
`stream`, subgraphs, a graph run from a node) take LangGraph's own methods.

A v3 event stream (`stream_events` / `astream_events` with `version="v3"`) runs its graph
only when the caller iterates it, after the call returned: those calls take LangGraph's
method, and the run is routed where it starts, at the graph's own `stream` / `astream`.

`TEOLA_LANGGRAPH_RUNNABLE_NODES=1` optimizes with `runnable_nodes=True` (chains added as
nodes run through `teola.optimize(chain)`).
"""

from __future__ import annotations

import functools
import os
from typing import Any

from langgraph.pregel import Pregel
from routing import flush, route, set_current_test

import teola

METHODS = (
    "invoke",
    "ainvoke",
    "stream",
    "astream",
    "batch",
    "abatch",
    "batch_as_completed",
    "abatch_as_completed",
    "stream_events",
    "astream_events",
    "astream_log",
)


def pytest_configure(config: Any) -> None:
    optimize = functools.partial(teola.optimize, runnable_nodes=os.environ.get("TEOLA_LANGGRAPH_RUNNABLE_NODES") == "1")
    route((Pregel,), METHODS, optimize)
    for name in ("stream_events", "astream_events"):
        setattr(Pregel, name, _v3_routed_where_it_runs(getattr(Pregel, name)))


def _v3_routed_where_it_runs(routed: Any) -> Any:
    original = routed.__wrapped__

    @functools.wraps(original)
    def method(self: Any, *args: Any, version: str = "v2", **kwargs: Any) -> Any:
        call = original if version == "v3" else routed
        return call(self, *args, version=version, **kwargs)

    return method


def pytest_runtest_setup(item: Any) -> None:
    set_current_test(item.nodeid)


def pytest_sessionfinish(session: Any) -> None:
    flush()
