"""LangChain adapter: trace an LCEL chain into Teola graphs and run it as a drop-in runnable.

    from teola_langchain import optimize
    fast = optimize(chain)
    fast.invoke(x) == chain.invoke(x)

Needs `langchain-core` (`pip install 'teola[langchain]'`).
"""

from typing import Any

from teola_langchain.components.compression import register_per_pair_cross_encoder
from teola_langchain.components.parsers import LineListOutputParser
from teola_langchain.runnable import TeolaRunnable
from teola_langchain.runnable import optimize as optimize_chain
from teola_langchain.tracing.session import OpaqueStepWarning
from teola_langchain.tracing.traced import TracedChain
from teola_langchain.tracing.tracer import trace


def optimize(runnable: Any, **options: Any) -> Any:
    """The drop-in of a LangChain runnable; a compiled LangGraph graph (a `create_agent` agent
    included) goes to `teola_langchain.langgraph` (langgraph is imported only then)."""
    if any(c.__module__.split(".")[0] == "langgraph" for c in type(runnable).__mro__):
        from teola_langchain.langgraph import optimize as optimize_langgraph

        return optimize_langgraph(runnable, **options)
    return optimize_chain(runnable, **options)


__all__ = [
    "LineListOutputParser",
    "OpaqueStepWarning",
    "TeolaRunnable",
    "TracedChain",
    "optimize",
    "register_per_pair_cross_encoder",
    "trace",
]
