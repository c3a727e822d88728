"""What `optimize` finds in a compiled `create_agent` graph: its `TeolaMiddleware` and its tools.

Both are read from the graph's builder nodes: the middleware by the `before_agent` step it
adds, the tools from the agent's `ToolNode`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.tools import BaseTool
from langgraph.prebuilt import ToolNode

from teola_langchain.agents.middleware import TeolaMiddleware


def teola_middlewares(graph: Any) -> list[TeolaMiddleware]:
    """The `TeolaMiddleware` instances of a compiled graph, found by their `before_agent` steps
    (none for a graph that is not a `StateGraph` agent)."""
    nodes = getattr(getattr(graph, "builder", None), "nodes", None)
    found: list[TeolaMiddleware] = []
    for spec in nodes.values() if isinstance(nodes, Mapping) else ():
        for func in (getattr(spec.runnable, "func", None), getattr(spec.runnable, "afunc", None)):
            owner = getattr(func, "__self__", None)
            if isinstance(owner, TeolaMiddleware) and owner not in found:
                found.append(owner)
    return found


def find_middleware(agent: Any) -> TeolaMiddleware:
    """The agent's `TeolaMiddleware`, found by its `before_agent` step in the graph."""
    if not isinstance(getattr(getattr(agent, "builder", None), "nodes", None), Mapping):
        raise TypeError(
            f"teola.optimize got a {type(agent).__name__}, not a compiled LangChain agent: build it with "
            "langchain.agents.create_agent(model, tools, middleware=[TeolaMiddleware()]) "
            "(from teola_langchain.agents import TeolaMiddleware)"
        )
    found = teola_middlewares(agent)
    if not found:
        raise TypeError(
            f"teola.optimize cannot hook the agent {agent.get_name()!r}: a compiled agent keeps its model and "
            "tools in closures Teola cannot re-wire. Add Teola's middleware when building it: "
            "create_agent(model, tools, middleware=[..., TeolaMiddleware()]) "
            "(from teola_langchain.agents import TeolaMiddleware), then teola.optimize(agent)"
        )
    if len(found) > 1:
        raise TypeError(f"the agent {agent.get_name()!r} has {len(found)} TeolaMiddleware instances: add one")
    return found[0]


def tool_names(agent: Any) -> frozenset[str]:
    """The names of the tools the agent's tool node runs."""
    return frozenset(agent_tools(agent))


def agent_tools(agent: Any) -> dict[str, BaseTool]:
    """The tools the agent's tool node runs, by name."""
    tools: dict[str, BaseTool] = {}
    for spec in agent.builder.nodes.values():
        if isinstance(spec.runnable, ToolNode):
            tools.update(spec.runnable.tools_by_name)
    return tools


__all__ = ["agent_tools", "find_middleware", "teola_middlewares", "tool_names"]
