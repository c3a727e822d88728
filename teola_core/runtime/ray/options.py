"""The `ray=` option of the Ray backend: where Ray is and where each engine runs.

    teola.optimize(app, backend="ray", ray={
        "address": "ray://head:10001",                       # default: RAY_ADDRESS, else a local cluster
        "engines": {
            "llm": {"num_gpus": 1, "num_replicas": 2},        # by engine name (see explain())
            EmbeddingsEngine: {"resources": {"cpu_node": 1}},  # or by Engine class (its subclasses too)
        },
    })

Every engine runs in Ray actors (one replica each unless told) except those that must
stay in the driver (`Engine.driver_only`: the framework engines that call a user's
LangChain / LlamaIndex objects with each query's callbacks) and those given
`{"in_driver": True}`. `RayOptions.parse` checks the option's shape and `placements`
checks it against the app's engines; both fail with an error naming what is wrong.

An app made of parts that each place their own engines (the chains of a LangGraph graph,
the query engines inside a router) gives every part `options.for_parts()`: a part
places the keys that match its engines, and the owner calls `check_keys(parts)` once
every part is built, so a key that matches no part's engines still fails.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from teola_core.engines.protocol import Engine, EngineSet

DEFAULT_REPLICA_WAIT_S = 300.0  # a model may take minutes to load


@dataclass(frozen=True)
class EngineOptions:
    """How one engine is placed on the cluster.

    num_replicas: actors serving the engine (each builds its own copy). num_cpus /
    num_gpus / memory / resources: what each actor reserves (Ray places it on a node that
    has them). concurrency: batches one replica runs at once (default: the engine's own
    `limits.concurrency`). replica_wait_s: how long a call waits for a replica that is
    starting or being replaced before it fails. max_restarts: replacements of a lost
    replica (-1: unlimited). in_driver: run this engine in the driver process instead.
    actor_options: any other `ray.remote` actor option (e.g. `runtime_env`).
    """

    num_replicas: int = 1
    num_cpus: float | None = None
    num_gpus: float | None = None
    memory: float | None = None
    resources: Mapping[str, float] = field(default_factory=dict)
    concurrency: int | None = None
    replica_wait_s: float = DEFAULT_REPLICA_WAIT_S
    max_restarts: int = -1
    in_driver: bool = False
    actor_options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, value: Mapping[str, Any], where: str) -> dict[str, Any]:
        """The checked fields given in `value` (only those: several keys may match one engine)."""
        if not isinstance(value, Mapping):
            raise TypeError(f"{where}: expected a dict of engine options, got {type(value).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"{where}: unknown option(s) {unknown} (known: {', '.join(sorted(known))})")
        out = dict(value)
        for key in ("num_replicas", "concurrency", "max_restarts"):
            if out.get(key) is not None and (isinstance(out[key], bool) or not isinstance(out[key], int)):
                raise TypeError(f"{where}: {key} must be an int, got {out[key]!r}")
        if out.get("num_replicas", 1) < 1:
            raise ValueError(f"{where}: num_replicas must be at least 1, got {out['num_replicas']}")
        if out.get("concurrency") is not None and out["concurrency"] < 1:
            raise ValueError(f"{where}: concurrency must be at least 1, got {out['concurrency']}")
        if out.get("max_restarts", -1) < -1:
            raise ValueError(f"{where}: max_restarts must be -1 (unlimited) or more, got {out['max_restarts']}")
        for key in ("num_cpus", "num_gpus", "memory", "replica_wait_s"):
            if out.get(key) is not None:
                out[key] = _amount(out[key], f"{where}: {key}")
        if "resources" in out:
            resources = out["resources"]
            if not isinstance(resources, Mapping) or not all(isinstance(k, str) for k in resources):
                raise TypeError(f"{where}: resources must map resource names to amounts, got {resources!r}")
            out["resources"] = {k: _amount(v, f"{where}: resources[{k!r}]") for k, v in resources.items()}
        if not isinstance(out.get("in_driver", False), bool):
            raise TypeError(f"{where}: in_driver must be True or False, got {out['in_driver']!r}")
        if not isinstance(out.get("actor_options", {}), Mapping):
            raise TypeError(f"{where}: actor_options must be a dict, got {out['actor_options']!r}")
        return out

    def request(self) -> dict[str, float]:
        """What one replica needs of a node for Ray to place it (Ray's default: one CPU)."""
        need = {"CPU": 1.0 if self.num_cpus is None else self.num_cpus, **self.resources}
        if self.num_gpus:
            need["GPU"] = self.num_gpus
        if self.memory:
            need["memory"] = self.memory
        return {k: v for k, v in need.items() if v > 0}


def _amount(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where} must be a non-negative number, got {value!r}")
    return float(value)


EngineKey = str | type[Engine]


@dataclass(frozen=True)
class RayOptions:
    """The parsed `ray=` option (see the module docstring).

    address: `ray.init(address=...)` when this process is not connected yet (None: the
    `RAY_ADDRESS` cluster, else a new local one). init: other `ray.init` keyword
    arguments. engines: per engine name or `Engine` subclass, its `EngineOptions` fields.
    """

    address: str | None = None
    init: Mapping[str, Any] = field(default_factory=dict)
    engines: Mapping[EngineKey, Mapping[str, Any]] = field(default_factory=dict)
    partial: bool = False  # for one part of an app (`for_parts`); not a key of the option

    @classmethod
    def parse(cls, value: RayOptions | Mapping[str, Any] | None) -> RayOptions:
        if value is None:
            return cls()
        if isinstance(value, RayOptions):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"ray=: expected a dict (address, init, engines), got {type(value).__name__}")
        known = {f.name for f in fields(cls)} - {"partial"}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"ray=: unknown key(s) {unknown} (known: {', '.join(sorted(known))})")
        address = value.get("address")
        if address is not None and not isinstance(address, str):
            raise TypeError(f"ray=: address must be a string such as 'auto' or 'ray://host:10001', got {address!r}")
        init = value.get("init", {})
        if not isinstance(init, Mapping) or "address" in init:
            raise ValueError("ray=: init must be a dict of ray.init keyword arguments (give the address as 'address')")
        engines = value.get("engines", {})
        if not isinstance(engines, Mapping):
            raise TypeError(f"ray=: engines must be a dict keyed by engine name or Engine class, got {engines!r}")
        parsed: dict[EngineKey, Mapping[str, Any]] = {}
        for key, options in engines.items():
            if not (isinstance(key, str) or (isinstance(key, type) and issubclass(key, Engine))):
                raise TypeError(f"ray=: engines keys are engine names or Engine subclasses, got {key!r}")
            parsed[key] = EngineOptions.parse(options, f"ray=: engines[{_key_name(key)}]")
        return cls(address=address, init=dict(init), engines=parsed)

    def for_parts(self) -> RayOptions:
        """These options for one part of an app: keys that match none of its engines are left to
        the other parts (see the module docstring)."""
        return replace(self, partial=True)

    def placements(self, engines: EngineSet) -> dict[str, EngineOptions | None]:
        """Per engine name: its options, or None when it runs in the driver.

        Fails when a key matches no engine (unless `partial`), or asks to put a `driver_only`
        engine in actors.
        """
        for key in self.engines:
            if not _matches(key, engines):
                if self.partial:
                    continue
                raise _unmatched(key, [engines])
            if isinstance(key, str):
                _check_placeable(key, engines[key], self.engines[key])
            elif key.driver_only:
                _check_placeable(key.__name__, key, self.engines[key])
        out: dict[str, EngineOptions | None] = {}
        for name, engine in engines.engines.items():
            given: dict[str, Any] = {}
            for key in self._class_keys(engine):
                given.update(self.engines[key])
            given.update(self.engines.get(name, {}))
            options = EngineOptions(**given)
            out[name] = None if options.in_driver or engine.driver_only else options
        return out

    def check_keys(self, parts: Sequence[EngineSet]) -> None:
        """Fail naming a key that matches no engine of any part of the app."""
        for key in self.engines:
            if not any(_matches(key, part) for part in parts):
                raise _unmatched(key, parts)

    def _class_keys(self, engine: Engine) -> list[type[Engine]]:
        """The class keys `engine` is an instance of, the most general first (so specific ones win)."""
        mro = type(engine).__mro__
        keys = [k for k in self.engines if isinstance(k, type) and isinstance(engine, k)]
        return sorted(keys, key=lambda k: -mro.index(k) if k in mro else 0)


def _matches(key: EngineKey, engines: EngineSet) -> bool:
    if isinstance(key, str):
        return key in engines
    return any(isinstance(e, key) for e in engines.engines.values())


def _unmatched(key: EngineKey, parts: Sequence[EngineSet]) -> ValueError:
    known = ", ".join(sorted({name for part in parts for name in part.engines})) or "none"
    if isinstance(key, str):
        return ValueError(
            f"ray=: engines names {key!r}, which this app does not use (its engines: {known}; explain() lists them)"
        )
    return ValueError(f"ray=: engines names class {key.__name__}, which no engine of this app is ({known})")


def _check_placeable(what: str, engine: Engine | type[Engine], options: Mapping[str, Any]) -> None:
    if engine.driver_only and not options.get("in_driver", False):
        cls = engine if isinstance(engine, type) else type(engine)
        raise ValueError(
            f"ray=: engine {what!r} ({cls.__name__}) cannot run in a Ray actor: it calls the app's own objects "
            "with each query's callbacks and config, which stay in the driver process. It runs in the driver; "
            "place the servers it calls instead, or drop it from ray['engines']"
        )


def _key_name(key: EngineKey) -> str:
    return repr(key) if isinstance(key, str) else key.__name__
