"""LangChain 1.x agents whose model and tool calls run on Teola's agent runtime: `optimize(agent)`.

    from langchain.agents import create_agent
    from teola import optimize
    from teola_langchain.agents import TeolaMiddleware

    agent = create_agent(model, tools, middleware=[..., TeolaMiddleware()])   # Teola's last
    fast = optimize(agent, idempotent_tools={"read_file": "v1"})
    fast.invoke({"messages": [("user", "...")]}, {"configurable": {"thread_id": "t1"}}, context=ctx)

`optimized.py`: `OptimizedAgent`, `optimize_agent`; `middleware.py`: `TeolaMiddleware`, the
hook into the agent's calls; `run.py`: one run's model and tool calls (`engine.py`: the
engine its model calls run on; `caller_turn.py`: where they run); `graph.py`: what is read
from the compiled agent; `summarization.py`: summaries written while the tools run.
"""

from teola_langchain.agents.middleware import TeolaMiddleware
from teola_langchain.agents.optimized import OptimizedAgent, optimize_agent

__all__ = ["OptimizedAgent", "TeolaMiddleware", "optimize_agent"]
