"""`TeolaMiddleware`: the hook by which `optimize(agent)` reaches a LangChain agent's calls.

`create_agent` returns a compiled LangGraph graph whose model and tool nodes close over
the model, the tools and the middleware stack; nothing public lets Teola re-wire an
already compiled agent reliably. So the agent carries this middleware (LangChain's own
`wrap_model_call` / `wrap_tool_call` and their async twins). Listed last, it is the
innermost wrapper: every real model call (retries of outer middleware included) is one
Teola model call, and the tool cache keeps raw tool results.

An agent built with it but invoked directly (not through `optimize`) runs as plain
LangChain: the middleware passes every call through. Its empty `before_agent` step is how
`optimize` finds it: streams of `updates` show it as
`{"TeolaMiddleware.before_agent": None}`, as for any middleware with that hook.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware, ModelRequest
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config
from langgraph.prebuilt.tool_node import ToolCallRequest

from teola_langchain.agents.run import AgentRun, ModelHandler, ToolHandler, run_in


class TeolaMiddleware(AgentMiddleware[Any, Any]):
    """Routes the agent's model and tool calls through Teola when run by `optimize(agent)`.

    Add it to `create_agent(..., middleware=[..., TeolaMiddleware()])`, preferably last
    (innermost). Outside an optimized run it passes every call through unchanged.
    """

    def before_agent(self, state: Any, runtime: Any) -> None:
        """Nothing: the step only lets `optimize(agent)` find this middleware in the graph."""
        return None

    async def abefore_agent(self, state: Any, runtime: Any) -> None:
        return None

    def wrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> Any:
        run = self._run(get_config())
        return handler(request) if run is None else run.model_call(request, handler)

    async def awrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[Any]]) -> Any:
        run = self._run(get_config())
        return await handler(request) if run is None else await run.amodel_call(request, handler)

    def wrap_tool_call(self, request: ToolCallRequest, handler: ToolHandler) -> Any:
        run = self._run(request.runtime.config)
        return handler(request) if run is None else run.tool_call(request, handler)

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[Any]]
    ) -> Any:
        run = self._run(request.runtime.config)
        return await handler(request) if run is None else await run.atool_call(request, handler)

    def _run(self, config: RunnableConfig | None) -> AgentRun | None:
        """This run's Teola state, if an optimized agent built with this middleware runs it."""
        run = run_in(config)
        return run if run is not None and run.agent.middleware is self else None


__all__ = ["TeolaMiddleware"]
