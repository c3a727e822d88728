"""Several independent instances of one simulated engine behind one name, and a router.

    llm = SimReplicas([SimLLM(LLM, name=f"llm#{i}") for i in range(2)], name="llm")
    engines = EngineSet().add(llm)   # graphs target "llm"; each call runs on one instance

Each instance keeps its own queue, step loop and caches, as two vLLM servers do. The
routing rule, as a least-request load balancer in front of vLLM servers routes: a decode
goes to the instance that made its `kv` handle (its KV lives there); any other call to
the instance with the fewest calls in flight, ties to the one after the last chosen
(round robin). A full prefill is such a call: it lands where its partial prefill ran only
if that instance is among the least loaded (then it is preferred), and elsewhere starts
without the partial's KV (`prefix_kv` dropped), as a warm-up request's prefix helps only
the server that holds it. The rule is the same for every system a benchmark compares.
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
        kv = call.inputs.get("kv")
        if isinstance(kv, KVHandle):
            return self._owner(call, kv)
        n = len(self.instances)
        order = [(self._cursor + k) % n for k in range(n)]
        least = min(self._load)
        prefix = call.inputs.get("prefix_kv")
        if isinstance(prefix, KVHandle) and prefix.engine in self._by_name:
            order.insert(0, self._by_name[prefix.engine])  # preferred among the least loaded
        chosen = next(i for i in order if self._load[i] == least)
        self._cursor = (chosen + 1) % n
        return chosen

    def _owner(self, call: Call, kv: KVHandle) -> int:
        if kv.engine not in self._by_name:
            raise ValueError(
                f"{self.name}: {call.node.describe()} carries a KV handle of engine {kv.engine!r}, "
                f"not of an instance of this engine ({', '.join(self._by_name)})"
            )
        return self._by_name[kv.engine]

    def _for(self, home: int, call: Call) -> Call:
        """The call as instance `home` gets it: without a partial prefill's KV it does not hold."""
        prefix = call.inputs.get("prefix_kv")
        if isinstance(prefix, KVHandle) and prefix.engine != self.instances[home].name:
            return Call(call.query_id, call.node, {**call.inputs, "prefix_kv": None})
        return call

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
                out = await self.instances[home].run([self._for(home, calls[i]) for i in indices])
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
