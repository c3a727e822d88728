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
a run's last call would wait behind every later run's fan-out. Set it to what the server
runs at once (vLLM's `--max-num-seqs`, llama.cpp's `--parallel`, an API's concurrency
limit): measured on the simulated servers, a bound below what the server itself batches
only loses throughput (a continuous-batching server that takes every request batches
them better than any order Teola could choose), so by default (None) nothing waits.

    admission = ModelAdmission(concurrency=16)
    held = HeldCall.on_running_loop()
    task = asyncio.create_task(admission.hold("llm:gpt-x", held, rank=3, call_id="run3/1"))
    await held.admitted           # the call may go now
    held.end()                    # its end reached the callbacks: the slot is free
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from teola_core.engines.protocol import Call, EngineSet
from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import PortSpec, PrimitiveKind
from teola_core.ir.types import KVHandle, PortType
from teola_core.runtime.base import RuntimeHook
from teola_core.runtime.local import LocalRuntime
from teola_langchain.agent_engine import AgentModelEngine

UNBOUNDED = sys.maxsize


@dataclass(eq=False)
class HeldCall:
    """A model call waiting for its turn (`admitted`), then in flight until `end()`."""

    admitted: asyncio.Future[None]
    ended: asyncio.Future[None]

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

    def __init__(self, concurrency: int | None = None, hooks: Sequence[RuntimeHook] = ()) -> None:
        if concurrency is not None and concurrency < 1:
            raise ValueError(f"model_concurrency must be at least 1 or None (got {concurrency})")
        self.concurrency = concurrency
        self.hooks = tuple(hooks)
        self._gates: dict[str, tuple[LocalRuntime, Graph]] = {}

    def engines(self) -> list[str]:
        return list(self._gates)

    def runtime(self, engine: str) -> LocalRuntime:
        return self._gates[engine][0]

    async def hold(self, engine: str, held: HeldCall, *, rank: int, call_id: str) -> None:
        """Queue `held` on `engine`'s scheduler by `rank`; returns when the call has ended."""
        gate = self._gates.get(engine)
        if gate is None:
            runtime = LocalRuntime(EngineSet().add(HeldCallEngine(engine, self.concurrency or UNBOUNDED)))
            for hook in self.hooks:
                runtime.add_hook(hook)
            gate = self._gates[engine] = (runtime, _call_graph(engine))
        runtime, graph = gate
        await runtime.run(graph, {"kv": KVHandle(engine, held)}, query_id=call_id, arrival=rank)

    async def close(self) -> None:
        for runtime, _ in self._gates.values():
            await runtime.close()
        self._gates.clear()


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
