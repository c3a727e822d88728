"""What Teola reads from a compiled graph's structure: its kinds of nodes, and agents.

A node's `bound` (the runnable LangGraph runs for it) is a function (`RunnableCallable`),
a composed LCEL runnable (a chain added as a node), a compiled graph (a subgraph), a
`ToolNode`, or another runnable. Only its type decides, never its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableBranch, RunnableParallel, RunnableSequence
from langgraph._internal._runnable import RunnableCallable  # where LangChain's create_agent imports it from
from langgraph.prebuilt import ToolNode
from langgraph.pregel import Pregel
from langgraph.pregel._read import DEFAULT_BOUND

LCEL_CHAINS = (RunnableSequence, RunnableParallel, RunnableBranch)
"""Composed runnables that `teola.optimize` traces as a chain (what LangChain's own suite routes)."""


@dataclass(frozen=True)
class NodeKind:
    name: str
    kind: str  # "function", "chain", "subgraph", "tools" or "runnable"
    runnable: str  # the bound runnable's class


def node_kinds(graph: Pregel) -> list[NodeKind]:
    """Every node of the graph that runs something (LangGraph's START node does not), in graph order."""
    return [
        NodeKind(name, _kind(node.bound), type(node.bound).__name__)
        for name, node in graph.nodes.items()
        if node.bound is not DEFAULT_BOUND
    ]


def _kind(bound: Any) -> str:
    if isinstance(bound, Pregel):
        return "subgraph"
    if isinstance(bound, ToolNode):
        return "tools"
    if isinstance(bound, LCEL_CHAINS):
        return "chain"
    if isinstance(bound, RunnableCallable):
        return "function"
    return "runnable"


def is_create_agent(graph: Pregel) -> bool:
    """A graph compiled by LangChain's `create_agent`: it compiles LangChain's subagent stream
    transformer into every agent it builds (a type, not a name)."""
    try:
        from langchain.agents._subagent_transformer import SubagentTransformer
    except ImportError:  # a langchain without `create_agent` agents of this shape
        return False
    return SubagentTransformer in tuple(getattr(graph, "stream_transformers", ()))
