"""Several independent instances of one simulated engine behind one name, and a router.

    llm = SimReplicas([SimLLM(LLM, name=f"llm#{i}") for i in range(2)], name="llm")
    engines = EngineSet().add(llm)   # graphs target "llm"; each call runs on one instance

Each instance keeps its own queue, step loop and caches, as two vLLM servers do. The
routing rule: a call that carries a `KVHandle` (a decode, a full prefill) goes to the
instance that made the handle, since its KV lives there; any other call goes to the
instance with the fewest calls in flight, ties to the one after the last chosen (round
robin), as a least-request load balancer in front of vLLM servers routes. The rule is
the same for every system a benchmark compares; it does not look at prefix caches.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits
from teola_core.ir.types import KVHandle


class SimReplicas(Engine):
    """`instances` engines (distinct names) serving as one engine called `name`."""

    def __init__(self, instances: Sequence[Engine], *, name: str) -> None:
        if not instances:
            raise ValueError("SimReplicas needs at least one instance")
        names = [e.name for e in instances]
        if len(set(names)) != len(names) or name in names:
            raise ValueError(f"replica names must be distinct and differ from {name!r}, got {names}")
        first = instances[0]
        self.name = name
        self.instances = tuple(instances)
        self.kinds = first.kinds
        self.profile = first.profile
        self.limits = EngineLimits(
            max_batch_items=first.limits.max_batch_items,
            concurrency=sum(e.limits.concurrency for e in instances),
            timeout_s=first.limits.timeout_s,
            instances=sum(e.limits.instances for e in instances),
        )
        self._by_name = {e.name: i for i, e in enumerate(instances)}
        self._load = [0] * len(instances)  # calls in flight, by instance
        self.served = [0] * len(instances)  # calls each instance was given
        self._cursor = 0

    @property
    def stats(self) -> Any:
        """The instances' stats added up (their class's `combined`)."""
        parts = [e.stats for e in self.instances]  # type: ignore[attr-defined]
        return type(parts[0]).combined(parts)

    def route(self, call: Call) -> int:
        """The instance that runs `call` (see the module docstring)."""
        for value in call.inputs.values():
            if isinstance(value, KVHandle):
                if value.engine not in self._by_name:
                    raise ValueError(
                        f"{self.name}: {call.node.describe()} carries a KV handle of engine {value.engine!r}, "
                        f"not of an instance of this engine ({', '.join(self._by_name)})"
                    )
                return self._by_name[value.engine]
        n = len(self.instances)
        order = [(self._cursor + k) % n for k in range(n)]
        chosen = min(order, key=self._load.__getitem__)
        self._cursor = (chosen + 1) % n
        return chosen

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        results: list[CallResult] = [RuntimeError("not run")] * len(calls)
        groups: dict[int, list[int]] = {}
        for i, call in enumerate(calls):
            try:
                home = self.route(call)
            except ValueError as exc:  # this call fails alone
                results[i] = exc
                continue
            groups.setdefault(home, []).append(i)
            self._load[home] += 1
            self.served[home] += 1

        async def on(home: int, indices: list[int]) -> None:
            try:
                out = await self.instances[home].run([calls[i] for i in indices])
            finally:
                self._load[home] -= len(indices)
            for i, result in zip(indices, out, strict=True):
                results[i] = result

        await asyncio.gather(*(on(home, indices) for home, indices in groups.items()))
        return results

    async def stream(self, call: Call) -> AsyncIterator[str]:
        home = self.route(call)
        self._load[home] += 1
        self.served[home] += 1
        try:
            async for delta in self.instances[home].stream(call):
                yield delta
        finally:
            self._load[home] -= 1

    async def close(self) -> None:
        for engine in self.instances:
            await engine.close()
