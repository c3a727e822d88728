"""Engines for the Ray backend tests; shipped to Ray workers by value (see conftest)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits
from teola_core.ir.kinds import PrimitiveKind as K
from teola_core.ir.types import KVHandle


class Gate:
    """A Ray actor: an engine `arrive`s with its actor id; the test awaits `arrived()` (no sleeps)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._who: str | None = None

    async def arrive(self, who: str) -> None:
        self._who = who
        self._event.set()

    async def arrived(self) -> str | None:
        await self._event.wait()
        return self._who


class Embedder(Engine):
    """Upper-cases texts. Input "raise" makes `run` raise; "block" arrives at the gate and hangs."""

    kinds = frozenset({K.EMBED})

    def __init__(self, name: str = "emb", gate: Any = None, concurrency: int = 1) -> None:
        self.name = name
        self.gate = gate
        self.limits = EngineLimits(concurrency=concurrency)

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        texts = [t for c in calls for t in c.inputs["texts"]]
        if "raise" in texts:
            raise ConnectionError("embedder is down")
        if "block" in texts and self.gate is not None:
            import ray

            await self.gate.arrive.remote(ray.get_runtime_context().get_actor_id())
            await asyncio.Event().wait()  # until the actor is killed
        return [{"vectors": [t.upper() for t in c.inputs["texts"]]} for c in calls]


class StatefulLLM(Engine):
    """Prefill keeps the prompt in this instance's memory; decode must run on the same instance."""

    kinds = frozenset({K.PREFILL, K.DECODE})
    limits = EngineLimits(concurrency=4)

    def __init__(self, name: str = "llm") -> None:
        self.name = name
        self._kv: dict[int, str] = {}
        self._ids = itertools.count()

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        out: list[CallResult] = []
        for c in calls:
            if c.node.kind == K.PREFILL:
                token = next(self._ids)
                self._kv[token] = c.inputs["prompt"]
                out.append({"kv": KVHandle(self.name, c.inputs["prompt"], token)})
            else:
                handle = c.inputs["kv"]
                if self._kv.get(handle.token) != handle.prompt:
                    out.append(KeyError(f"KV {handle.token} is not held by this instance"))
                else:
                    out.append({"text": f"answer to {self._kv.pop(handle.token)}"})
        return out


class Zero(Engine):
    """Answers at once: for measuring dispatch overhead."""

    kinds = frozenset({K.EMBED, K.PREFILL, K.DECODE})

    def __init__(self, name: str) -> None:
        self.name = name
        self.limits = EngineLimits(concurrency=4)

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        out: list[CallResult] = []
        for c in calls:
            if c.node.kind == K.EMBED:
                out.append({"vectors": list(c.inputs["texts"])})
            elif c.node.kind == K.PREFILL:
                out.append({"kv": KVHandle(self.name, c.inputs["prompt"])})
            else:
                out.append({"text": "ok"})
        return out
