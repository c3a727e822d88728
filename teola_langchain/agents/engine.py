"""The engine an optimized LangChain agent's model calls run on (one per optimized agent).

Its calls are the agent's own model calls (the middleware `handler`). The agent's model
is opaque to Teola (a framework object, no `KVRetention`), so KV holds do not apply to
it; priority applies once `model_concurrency` calls are running, or, for a langchain-openai
model on a vLLM-like server, once the server runs what it can (`load_watch`: the server is
found at the first call, `teola_adapters.server_load.ServerFoundLater`). Where that server
says how big its KV cache is, the engine is a `KVPool` of that size: the agent runtime
then admits programs by KV working set (`teola_core.agents.admission`). Where the server
takes vLLM's `priority` (asked once, `teola_adapters.server_priority`), each call carries
its program's priority there too, in the request's `extra_body`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from langchain.agents.middleware import ModelRequest

from teola_adapters.server_load import ServerFoundLater, reported_kv_tokens
from teola_adapters.server_priority import PriorityProbe, call_priority, with_priority
from teola_core.agents.token_rate import TokenRate
from teola_core.engines.opaque_llm import OpaqueModelEngine
from teola_core.engines.protocol import Call, EngineLimits
from teola_core.engines.retention import KVPool
from teola_langchain.prefix_warmup import server_root
from teola_langchain.program_order.working_set import message_usage, messages_chars


@dataclass(frozen=True)
class AgentModelCall:
    """A model call as the engine sees it: `run(request)` performs the agent's own call
    (with `request`, or the engine's copy of it carrying the call's priority)."""

    request: ModelRequest
    run: Callable[[ModelRequest], Awaitable[Any]]


class AgentModelEngine(OpaqueModelEngine, KVPool):
    """Runs an agent's model calls: decode awaits the call's `run()` (the middleware handler).

    One call per batch: each call is the agent's own model invocation, which has no
    batch API (as `LangChainLLMEngine`); `concurrency` bounds the calls running at once,
    beyond which the scheduler picks by program priority. On a server that reports its
    KV cache's size the engine is a `KVPool` of that size, so the agent runtime admits
    programs by KV working set there; a prompt's tokens are its characters at the
    tokens per character the server's usage reports have shown.
    """

    def __init__(self, name: str, concurrency: int, load_watch: ServerFoundLater | None = None) -> None:
        if concurrency < 1:
            raise ValueError(f"model_concurrency must be at least 1 (got {concurrency})")
        self.name = name
        self.limits = EngineLimits(concurrency=concurrency, max_batch_items=1)
        self.load_watch = load_watch
        self.rate = TokenRate()
        self.priority = PriorityProbe()

    async def generate(self, call: Call, prompt: Any) -> Any:
        if not isinstance(prompt, AgentModelCall):
            raise TypeError(f"{self.name} runs agent model calls, not {type(prompt).__name__}")
        watch, request = self.load_watch, prompt.request
        if watch is not None and watch.watch is None and (root := server_root(request.model)) is not None:
            watch.found(root)
            model = getattr(request.model, "model_name", None)
            if isinstance(model, str):
                self.priority.start(root, model)
        if self.priority.accepted:
            request = prioritized(request, call_priority(call))
        response = await prompt.run(request)
        usage = next((u for m in getattr(response, "result", ()) if (u := message_usage(m)) is not None), None)
        if usage is not None:
            self.rate.observe(request_chars(prompt.request), *usage)
        return response

    def notes(self) -> list[str]:
        return [self.priority.describe()] if self.load_watch is not None else []

    async def close(self) -> None:
        await self.priority.aclose()

    # -- KVPool ----------------------------------------------------------------------------
    def kv_capacity_tokens(self) -> int | None:
        """The KV cache of the model's server, once a reading has said (None before, or elsewhere)."""
        return reported_kv_tokens(self.load_watch)

    def count_tokens(self, text: Any) -> int | None:
        if not isinstance(text, AgentModelCall):
            return None
        return self.rate.prompt_tokens_of(request_chars(text.request))


def prioritized(request: ModelRequest, priority: int) -> ModelRequest:
    """The request with vLLM's `priority` in the model's `extra_body` (a model setting, so
    the model object is untouched; the model's own `extra_body` is kept beside it)."""
    settings = dict(request.model_settings)
    extra = settings["extra_body"] if "extra_body" in settings else getattr(request.model, "extra_body", None)
    settings["extra_body"] = with_priority(extra, priority)
    return request.override(model_settings=settings)


def request_chars(request: ModelRequest) -> int:
    """The characters of a model request's prompt: its system message and messages."""
    system = [request.system_message] if request.system_message is not None else []
    return messages_chars([*system, *request.messages])


__all__ = ["AgentModelCall", "AgentModelEngine"]
