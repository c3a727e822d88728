"""The one protocol every engine implements.

An engine runs a batch of primitive calls (possibly of several queries) and returns one
result per call, in order: a dict of output port values, or an exception that fails
that call alone. LLM engines may also stream a decode as text deltas. Everything else
(`run_one`, the default `stream`) derives from `run`, as langchain-core derives
`batch` from `invoke`.

    class Upper(Engine):
        name = "upper"
        async def run(self, calls):
            return [{"text": c.inputs["text"].upper()} for c in calls]
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from teola_core.ir.kinds import Capabilities, PrimitiveKind
from teola_core.ir.node import Node

if TYPE_CHECKING:
    from teola_core.profiles.profile import LatencyProfile


@dataclass(frozen=True)
class Call:
    """One primitive invocation: the node, its input values, and whose query it is.

    context: what the query's caller gave `Runtime.run(..., context=)` — per-query state an
    engine over a framework's object needs (e.g. the caller's callbacks); None otherwise.
    arrival: when the query arrived (the runtime's clock; None: not known), so an engine
    that orders work itself serves earlier queries first, ties by the order they came.
    """

    query_id: str
    node: Node
    inputs: Mapping[str, Any]
    context: Any = field(default=None, compare=False, repr=False)
    arrival: float | None = field(default=None, compare=False)

    @property
    def items(self) -> int:
        """How many items this call carries (1 for item-less primitives)."""
        for port in self.node.caps.item_inputs:
            value = self.inputs.get(port)
            if isinstance(value, Sequence):
                return len(value)
        return 1


CallResult = Mapping[str, Any] | BaseException


@dataclass(frozen=True)
class StreamResult:
    """The last item a stream may yield: the decode's whole output, when it is not just the
    text deltas joined (a framework model's message object). It becomes the "text" output."""

    value: Any


@dataclass(frozen=True)
class EngineLimits:
    """What the engine scheduler must respect.

    max_batch_items: the most items one batch may carry (None: as many as given).
    concurrency: batches that may run at once (instances, or an LLM's running set).
    timeout_s: a batch running longer fails its calls (None: no limit).
    instances: how many engine instances serve this engine; a policy that runs one
      invocation at a time per instance (per-invocation batching) uses it.
    device: what the engine computes on, when it may be shared ("cpu", "cuda:0"): engines
      on one device do not run in parallel, whatever their names, so a pass that would
      overlap their work leaves it alone. None: hardware of its own (a remote server).
    """

    max_batch_items: int | None = None
    concurrency: int = 1
    timeout_s: float | None = None
    instances: int = 1
    device: str | None = None


class EngineControls(Protocol):
    """What a runtime lets an engine's load watch do: see its queue, set its concurrency."""

    def watch_engine(self, engine: str, watcher: Callable[[int, int], None]) -> None: ...

    def set_concurrency(self, engine: str, concurrency: int) -> None: ...

    def on_close(self, callback: Callable[[], Awaitable[None]]) -> None: ...


class LoadWatch(Protocol):
    """Learns an engine's concurrency from its server while a runtime runs it (one per runtime)."""

    def attach(self, runtime: EngineControls, engine: str) -> None: ...


class Engine(ABC):
    """Base class of all engines. Subclasses implement `run` (and `stream` if they can)."""

    name: str = "engine"
    kinds: frozenset[PrimitiveKind] = frozenset()
    limits: EngineLimits = EngineLimits()
    profile: LatencyProfile | None = None
    # True for an engine that needs per-query state which cannot leave this process (the
    # caller's callbacks and config, for engines over a framework's objects): the Ray
    # backend runs it in the driver and refuses to place it in an actor.
    driver_only: bool = False
    # Set for an engine whose server reports its load (a vLLM-like server's /metrics): the
    # local runtime attaches it, and it sets the engine's concurrency from what it learns.
    load_watch: LoadWatch | None = None

    @abstractmethod
    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        """Run a batch; one result (outputs or an exception) per call, in order."""

    async def run_one(self, call: Call) -> Mapping[str, Any]:
        (result,) = await self.run([call])
        if isinstance(result, BaseException):
            raise result
        return result

    async def stream(self, call: Call) -> AsyncIterator[str | StreamResult]:
        """Decode as text deltas (then, optionally, a `StreamResult`). Default: the whole text."""
        outputs = await self.run_one(call)
        yield outputs["text"]

    def capabilities(self, kind: PrimitiveKind, caps: Capabilities) -> Capabilities:
        """Narrow a kind's default capabilities (e.g. an engine that cannot batch)."""
        return caps

    def notes(self) -> list[str]:
        """What the engine learned of the server it calls, for `explain()`. Default: nothing."""
        return []

    async def close(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Release resources. Default: nothing to release."""


class PerCallEngine(Engine):
    """An engine whose calls run on their own, concurrently: `run` derives from `run_call`.

    For engines over objects with no batch API that returns what single calls would
    (a framework's model, a retriever): a call that raises fails alone.
    """

    @abstractmethod
    async def run_call(self, call: Call) -> Mapping[str, Any]:
        """One call's outputs."""

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        return list(await asyncio.gather(*(self.run_call(c) for c in calls), return_exceptions=True))


class JointCallEngine(PerCallEngine):
    """A per-call engine whose calls may share one model call where the engine proves that
    joint call returns what the calls would alone (`joint`): a batch of two or more runs as
    `run_jointly`; if that raises (or returns the wrong count), each call runs alone
    (`run_call`) and fails alone. `joint_calls` / `joint_failures` count what happened."""

    joint: bool = False  # set where proven: only then do several calls share a model call

    def __init__(self) -> None:
        self.joint_calls = 0  # model calls that served several calls
        self.joint_failures = 0  # joint calls that raised (their calls then ran one by one)

    @abstractmethod
    async def run_jointly(self, calls: Sequence[Call]) -> list[CallResult]:
        """Every call's result from one joint model call (a call may still fail alone)."""

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        if self.joint and len(calls) > 1:
            try:
                results = await self.run_jointly(calls)
                if len(results) != len(calls):
                    raise ValueError(f"{self.name}: a joint call gave {len(results)} results for {len(calls)} calls")
            except Exception:  # each call runs alone below, and fails alone
                self.joint_failures += 1
            else:
                self.joint_calls += 1
                return results
        return await super().run(calls)


@dataclass
class EngineSet:
    """The engines a runtime uses, by name. Passed explicitly; there is no global registry."""

    engines: dict[str, Engine] = field(default_factory=dict)
    # (role, id(component)) -> (component, engine name); the object is kept so its id stays its own
    _components: dict[tuple[str, int], tuple[object, str]] = field(default_factory=dict, repr=False)

    def add(self, engine: Engine, name: str | None = None) -> EngineSet:
        key = name or engine.name
        if key in self.engines:
            raise ValueError(f"engine name {key!r} is already registered")
        self.engines[key] = engine
        return self

    def engine_for(self, component: object, role: str, make: Callable[[str], Engine]) -> str:
        """The name of the engine that runs `component` in `role`, made on first use.

        Framework adapters run a user's objects (a model, an embeddings object, a store)
        as engines: one engine per object and role, named `role:ClassName` (`#2`, `#3`
        when several objects of one class are used).
        """
        known = self._components.get((role, id(component)))
        if known is not None and known[0] is component:
            return known[1]
        base = f"{role}:{type(component).__name__}"
        name, n = base, 1
        while name in self.engines:
            n += 1
            name = f"{base}#{n}"
        self.add(make(name), name)
        self._components[(role, id(component))] = (component, name)
        return name

    def __getitem__(self, name: str) -> Engine:
        try:
            return self.engines[name]
        except KeyError:
            known = ", ".join(sorted(self.engines)) or "none"
            raise KeyError(f"no engine named {name!r} (registered: {known})") from None

    def __contains__(self, name: object) -> bool:
        return name in self.engines

    def profiles(self) -> dict[str, LatencyProfile]:
        return {name: e.profile for name, e in self.engines.items() if e.profile is not None}

    def devices(self) -> dict[str, str]:
        """Engine name -> the device it declares (engines of their own hardware are left out)."""
        return {name: e.limits.device for name, e in self.engines.items() if e.limits.device is not None}

    async def close(self) -> None:
        for engine in self.engines.values():
            await engine.close()
