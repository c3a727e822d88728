"""Model calls held until Teola admits them: one engine per model, earlier runs first.

A function node calls its model itself (`await llm.ainvoke(prompt)`), so Teola cannot
send the request; it can decide *when* it goes (`gate.py` holds the call in the model's
own `on_chat_model_start`). Each held call becomes a one-node graph (a decode) on
a `HeldCallEngine` of its model, run by a `LocalRuntime` whose topology policy admits the
calls of earlier runs first (`arrival` = the run's rank). The decode admits the call (the
model sends its own request) and lasts until the model's callbacks report its end, so a
slot is one call in flight.

`concurrency` (the optimize option `model_concurrency`) bounds the calls of one model in
flight; the others wait here, earlier runs first, instead of in the server's queue, where
a run's last call would wait behind every later run's fan-out. "auto" (the default)
learns the bound from the server itself: a vLLM-like server's `/metrics` say how many
requests run and wait (`teola_adapters.server_load`), calls go at once while it has
room and wait here only once requests wait there. Where the server also says how big
its KV cache is, a run calls only while its context fits beside the older runs'
(`working_set.py`): agents then stop evicting each other's prefixes. A server that reports no load (or a
model with no base URL) is never held. An int is a fixed bound (what the server runs at
once: vLLM's `--max-num-seqs`, llama.cpp's `--parallel`); None holds nothing.

    admission = ModelAdmission()                 # "auto"; or concurrency=16
    held = HeldCall.on_running_loop()
    task = asyncio.create_task(admission.hold("llm:gpt-x", held, rank=3, call_id="run3/1", server=url))
    await held.admitted           # the call may go now
    held.end()                    # its end reached the callbacks: the slot is free
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from teola_adapters.server_load import ServerCalls, ServerWatch
from teola_core.engines.protocol import Call, EngineSet
from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import PortSpec, PrimitiveKind
from teola_core.ir.types import KVHandle, PortType
from teola_core.runtime.base import RuntimeHook
from teola_core.runtime.local import LocalRuntime
from teola_langchain.agents.engine import AgentModelEngine
from teola_langchain.program_order.working_set import WorkingSets

UNBOUNDED = sys.maxsize
AUTO = "auto"
Concurrency = int | None | Literal["auto"]


def check_concurrency(concurrency: Concurrency) -> None:
    if concurrency == AUTO or concurrency is None:
        return
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"model_concurrency must be 'auto', None or an int >= 1 (got {concurrency!r})")


@dataclass(eq=False)
class HeldCall:
    """A model call waiting for its turn (`admitted`), then in flight until `end()`;
    `usage` (prompt and answer tokens) where the answer reported it."""

    admitted: asyncio.Future[None]
    ended: asyncio.Future[None]
    usage: tuple[int, int] | None = None

    @classmethod
    def on_running_loop(cls) -> HeldCall:
        loop = asyncio.get_running_loop()
        return cls(loop.create_future(), loop.create_future())

    def admit(self) -> None:
        if not self.admitted.done():
            self.admitted.set_result(None)

    def end(self) -> None:
        if not self.ended.done():
            self.ended.set_result(None)


class HeldCallEngine(AgentModelEngine):
    """A model's calls as Teola's engine sees them: decode admits one and waits for its end.

    As an agent's model engine: one call per batch (each is the model's own request; the
    server batches the calls in flight with each other), `concurrency` calls at once.
    """

    async def generate(self, call: Call, prompt: Any) -> None:
        if not isinstance(prompt, HeldCall):
            raise TypeError(f"{self.name} runs held model calls, not {type(prompt).__name__}")
        prompt.admit()
        await asyncio.shield(prompt.ended)


class ModelAdmission:
    """The held calls of one event loop: an engine and a runtime per model, made on first use."""

    def __init__(self, concurrency: Concurrency = AUTO, hooks: Sequence[RuntimeHook] = ()) -> None:
        check_concurrency(concurrency)
        self.concurrency = concurrency
        self.hooks = tuple(hooks)
        self._gates: dict[str, tuple[LocalRuntime, Graph]] = {}
        self._servers: dict[str, ServerCalls] = {}
        self._engines_at: dict[str, set[str]] = {}  # server root -> its engines (auto)
        self.working_sets = WorkingSets()

    def engines(self) -> list[str]:
        return list(self._gates)

    def add_hook(self, hook: RuntimeHook) -> None:
        """One more runtime hook, on every engine's gate (made so far and to come)."""
        self.hooks = (*self.hooks, hook)
        for runtime, _ in self._gates.values():
            runtime.add_hook(hook)

    def runtime(self, engine: str) -> LocalRuntime:
        return self._gates[engine][0]

    def servers(self) -> list[ServerCalls]:
        return list(self._servers.values())

    def describe_servers(self) -> list[str]:
        """One line per server read so far: its load as Teola knows it, and its working set."""
        lines = []
        for root, calls in self._servers.items():
            working = self.working_sets.at(root)
            lines.append(calls.describe() + ("" if working is None else f"; {working.describe()}"))
        return lines

    def passes(self, server: str | None) -> bool:
        """A call to `server` goes at once, untouched (nothing to learn or hold there)."""
        if self.concurrency != AUTO:
            return False
        return server is None or (server in self._servers and self._servers[server].vllm is False)

    async def hold(
        self,
        engine: str,
        held: HeldCall,
        *,
        rank: int,
        call_id: str,
        server: str | None = None,
        run: str | None = None,
        prompt_chars: int = 0,
    ) -> None:
        """Queue `held` on `engine`'s scheduler by `rank`; returns when the call has ended.
        On a server that reports its KV cache's size, `run` (whose prompt is `prompt_chars`
        long) first waits for room among the older runs' contexts (`working_set`)."""
        calls: ServerCalls | None = None
        if self.concurrency == AUTO:
            calls = self._server(server) if server is not None else None
            if calls is None or not calls.vllm:  # unknown (read it) or not vLLM-like: the call goes
                if calls is not None:
                    calls.want_reading()
                held.admit()
                await asyncio.shield(held.ended)
                return
            engine = f"{engine}@{server}"
            limit = calls.limit.limit
        else:
            limit = self.concurrency or UNBOUNDED
        gate = self._gates.get(engine)
        if gate is None:
            runtime = LocalRuntime(EngineSet().add(HeldCallEngine(engine, limit)))
            for hook in self.hooks:
                runtime.add_hook(hook)
            if calls is not None and server is not None:
                runtime.watch_engine(engine, calls.watcher(engine))
                self._engines_at.setdefault(server, set()).add(engine)
            gate = self._gates[engine] = (runtime, _call_graph(engine))
        runtime, graph = gate
        last = calls.last if calls is not None else None
        kv_tokens = last.kv_tokens if last is not None else None
        working = bool(kv_tokens) and run is not None and server is not None
        if working:
            costs = last.costs if last is not None else None
            await self.working_sets.call(server, kv_tokens, costs, run=run, rank=rank, prompt_chars=prompt_chars)
        try:
            await runtime.run(graph, {"kv": KVHandle(engine, held)}, query_id=call_id, arrival=rank)
        finally:
            if working:
                self.working_sets.done(server, run, prompt_chars=prompt_chars, usage=held.usage)

    def leave(self, run: str) -> None:
        """The run ended: the room its context took at the servers goes to the next runs."""
        self.working_sets.leave(run)

    def _server(self, root: str) -> ServerCalls:
        calls = self._servers.get(root)
        if calls is None:
            calls = self._servers[root] = ServerCalls(ServerWatch(root), lambda n: self._set_limit(root, n))
        return calls

    def _set_limit(self, root: str, limit: int) -> None:
        for engine in self._engines_at.get(root, ()):
            self._gates[engine][0].set_concurrency(engine, limit)

    async def close(self) -> None:
        for runtime, _ in self._gates.values():
            await runtime.close()
        self._gates.clear()
        for calls in self._servers.values():
            await calls.aclose()
        self._servers.clear()


def _call_graph(engine: str) -> Graph:
    """One model call: a decode (the model prefills its prompt in its own request, so a
    prefill primitive would only take a turn of the slot)."""
    b = GraphBuilder(f"{engine}/call")
    decode = b.add(
        PrimitiveKind.DECODE,
        {"kv": b.input("kv", PortType.KV)},
        engine=engine,
        input_ports=[PortSpec("kv", PortType.KV)],
        output_ports=[PortSpec("text", PortType.ANY)],
        name="model",
    )
    b.output(text=Value(decode.id, "text"))
    return b.build()
