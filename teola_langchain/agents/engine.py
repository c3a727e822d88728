"""The engine an optimized LangChain agent's model calls run on (one per optimized agent).

Its calls are the agent's own model calls (the middleware `handler`). The agent's model
is opaque to Teola (a framework object, no `KVRetention`), so KV holds do not apply to
it; priority applies once `model_concurrency` calls are running, or, for a langchain-openai
model on a vLLM-like server, once the server runs what it can (`load_watch`: the server is
found at the first call, `teola_adapters.server_load.ServerFoundLater`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from langchain.agents.middleware import ModelRequest

from teola_adapters.server_load import ServerFoundLater
from teola_core.engines.opaque_llm import OpaqueModelEngine
from teola_core.engines.protocol import Call, EngineLimits
from teola_langchain.prefix_warmup import server_root


@dataclass(frozen=True)
class AgentModelCall:
    """A model call as the engine sees it: `run()` performs the agent's own call."""

    request: ModelRequest
    run: Callable[[], Awaitable[Any]]


class AgentModelEngine(OpaqueModelEngine):
    """Runs an agent's model calls: decode awaits the call's `run()` (the middleware handler).

    One call per batch: each call is the agent's own model invocation, which has no
    batch API (as `LangChainLLMEngine`); `concurrency` bounds the calls running at once,
    beyond which the scheduler picks by program priority.
    """

    def __init__(self, name: str, concurrency: int, load_watch: ServerFoundLater | None = None) -> None:
        if concurrency < 1:
            raise ValueError(f"model_concurrency must be at least 1 (got {concurrency})")
        self.name = name
        self.limits = EngineLimits(concurrency=concurrency, max_batch_items=1)
        self.load_watch = load_watch

    async def generate(self, call: Call, prompt: Any) -> Any:
        if not isinstance(prompt, AgentModelCall):
            raise TypeError(f"{self.name} runs agent model calls, not {type(prompt).__name__}")
        watch = self.load_watch
        if watch is not None and watch.watch is None and (root := server_root(prompt.request.model)) is not None:
            watch.found(root)
        return await prompt.run()


__all__ = ["AgentModelCall", "AgentModelEngine"]
