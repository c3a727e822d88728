"""LangGraph: `teola.optimize(graph)` for compiled graphs (`StateGraph.compile()`, `@entrypoint`).

    fast = teola.optimize(graph)      # same state, streams, checkpoints; model calls on Teola

A `create_agent` agent built with `TeolaMiddleware` goes to `teola_langchain.agents`
(options: see `OptimizedAgent`); every other compiled graph to `optimize_graph` (options:
`model_concurrency`, `runnable_nodes`), `create_agent` agents without the middleware too.
"""

from __future__ import annotations

from typing import Any

from langgraph.pregel import Pregel

from teola_langchain.langgraph.optimized import OptimizedGraph, optimize_graph

AGENT_ONLY_OPTIONS = frozenset({"idempotent_tools", "features", "priority_rule", "on_program"})


def optimize(graph: Any, **options: Any) -> Any:
    """`teola.optimize` for LangGraph objects (see the module docstring)."""
    from teola_langchain.agents import optimize_agent
    from teola_langchain.agents.graph import teola_middlewares

    if teola_middlewares(graph):
        return optimize_agent(graph, **options)
    if isinstance(graph, Pregel):
        agent_only = sorted(set(options) & AGENT_ONLY_OPTIONS)
        if agent_only:
            raise TypeError(
                f"{agent_only} are options of agents built with TeolaMiddleware; {graph.get_name()!r} has none "
                "(build it with create_agent(..., middleware=[..., TeolaMiddleware()]))"
            )
        return optimize_graph(graph, **options)
    from teola_langchain.runnable import TeolaRunnable

    return TeolaRunnable(graph, **options)  # another LangGraph runnable (a RemoteGraph, say): one opaque step


__all__ = ["OptimizedGraph", "optimize", "optimize_graph"]
