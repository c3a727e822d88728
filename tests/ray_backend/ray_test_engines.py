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
    """A Ray actor the engines report to; tests await it instead of sleeping.

    An engine that meets "block:<key>" calls `arrive(key, actor_id)`: the first arrival of
    a key then `hold`s until the test `release`s the key (or the actor dies); later
    arrivals (the call re-sent elsewhere) go on. `arrived(key)` tells the test which actor
    holds the call.
    """

    def __init__(self) -> None:
        self._arrived: dict[str, asyncio.Event] = {}
        self._released: dict[str, asyncio.Event] = {}
        self._who: dict[str, list[str]] = {}

    async def arrive(self, key: str, who: str) -> bool:
        self._who.setdefault(key, []).append(who)
        self._arrived.setdefault(key, asyncio.Event()).set()
        return len(self._who[key]) == 1

    async def hold(self, key: str) -> None:
        await self._released.setdefault(key, asyncio.Event()).wait()

    async def release(self, key: str) -> None:
        self._released.setdefault(key, asyncio.Event()).set()

    async def arrived(self, key: str) -> str:
        await self._arrived.setdefault(key, asyncio.Event()).wait()
        return self._who[key][0]

    async def visits(self, key: str) -> list[str]:
        return list(self._who.get(key, []))


async def _maybe_block(gate: Any, text: str) -> None:
    """At "block:<key>": report to the gate; on the key's first arrival, hold until released."""
    if gate is None or not text.startswith("block:"):
        return
    import ray

    key = text.split(":", 1)[1]
    if await gate.arrive.remote(key, ray.get_runtime_context().get_actor_id()):
        await gate.hold.remote(key)


class Embedder(Engine):
    """Upper-cases texts. Input "raise" makes `run` raise; "block:<key>" stops at the gate."""

    kinds = frozenset({K.EMBED})

    def __init__(self, name: str = "emb", gate: Any = None, concurrency: int = 1) -> None:
        self.name = name
        self.gate = gate
        self.limits = EngineLimits(concurrency=concurrency)

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        texts = [t for c in calls for t in c.inputs["texts"]]
        if "raise" in texts:
            raise ConnectionError("embedder is down")
        for text in texts:
            await _maybe_block(self.gate, text)
        return [{"vectors": [t.upper() for t in c.inputs["texts"]]} for c in calls]


class StatefulLLM(Engine):
    """Prefill keeps the prompt in this instance's memory; decode must run on the same instance.

    A decode of a prompt holding "block:<key>" stops at the gate first.
    """

    kinds = frozenset({K.PREFILL, K.DECODE})

    def __init__(self, name: str = "llm", gate: Any = None, concurrency: int = 4) -> None:
        self.name = name
        self.gate = gate
        self.limits = EngineLimits(concurrency=concurrency)
        self._kv: dict[int, str] = {}
        self._ids = itertools.count()

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        return list(await asyncio.gather(*(self._one(c) for c in calls)))

    async def _one(self, c: Call) -> CallResult:
        if c.node.kind == K.PREFILL:
            token = next(self._ids)
            self._kv[token] = c.inputs["prompt"]
            return {"kv": KVHandle(self.name, c.inputs["prompt"], token)}
        handle = c.inputs["kv"]
        if self._kv.get(handle.token) != handle.prompt:
            return KeyError(f"KV {handle.token} is not held by this instance")
        prompt = self._kv.pop(handle.token)
        await _maybe_block(self.gate, prompt.removeprefix("Q: "))
        return {"text": f"answer to {prompt}"}


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


class DriverOnly(Embedder):
    """An engine that must stay in the driver (as the framework engines declare)."""

    driver_only = True


class BrokenInActor(Embedder):
    """Pickles in the driver; cannot be rebuilt in an actor (as a model file missing on a node)."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        raise OSError("model file missing on this node")


def missing_model() -> Engine:
    """An engine factory that fails where it runs (in the actor)."""
    raise OSError("model file missing on this node")
