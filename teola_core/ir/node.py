"""Nodes and edges of a primitive graph.

A node is an immutable record: an id stable across copies of its graph, a kind, the
engine that runs it, its named ports, its config and its capabilities. Passes build new
nodes with `dataclasses.replace`; they never mutate one that another graph holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from teola_core.ir.kinds import Capabilities, PortSpec, PrimitiveKind, spec_of

Port = PortSpec


def _freeze(config: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(config))


@dataclass(frozen=True)
class DecodePart:
    """Partial decode `index` of `count` over the one stream of decode `group`.

    Each part but the last hands on one parsed item; the last hands on every remaining
    item (possibly none or several), so the parts' chunks concatenate to exactly the
    parsed list whatever the model actually wrote.

        DecodePart("expand.decode", 0, 3).chunk(["a", "b", "c", "d"])  # ["a"]
        DecodePart("expand.decode", 2, 3).chunk(["a", "b", "c", "d"])  # ["c", "d"]
    """

    group: str
    index: int
    count: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"decode part {self.index} of {self.count} (group {self.group!r}) is out of range")

    @property
    def last(self) -> bool:
        return self.index == self.count - 1

    def ready(self, parsed: int) -> bool:
        """Whether this part's chunk is final once `parsed` items exist (the stream still running)."""
        return not self.last and parsed > self.index

    def chunk(self, items: list[Any]) -> list[Any]:
        return items[self.index :] if self.last else items[self.index : self.index + 1]


@dataclass(frozen=True, eq=False)
class Node:
    """One primitive of a graph.

    items: how many items the node's item ports carry, when known at build time (the
    number of documents to embed, of queries to search). Stage decomposition reads it.
    label: a human-readable origin (a module or a framework step) used in errors.
    part: which part of its decode's stream a PARTIAL_DECODE is (decode pipelining).
    """

    id: str
    kind: PrimitiveKind
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    engine: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    caps: Capabilities = field(default_factory=Capabilities)
    items: int | None = None
    module: str | None = None
    label: str | None = None
    part: DecodePart | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", _freeze(self.config))

    def input_port(self, name: str) -> Port | None:
        return next((p for p in self.inputs if p.name == name), None)

    def output_port(self, name: str) -> Port | None:
        return next((p for p in self.outputs if p.name == name), None)

    def with_config(self, **changes: Any) -> Node:
        return replace(self, config={**self.config, **changes})

    def describe(self) -> str:
        """`id (kind on engine, from label)`: how errors name a primitive."""
        where = f" on {self.engine}" if self.engine else ""
        origin = f", from {self.label}" if self.label else ""
        return f"{self.id} ({self.kind.value}{where}{origin})"

    def same_as(self, other: Node) -> bool:
        """Structural equality (ids, ports, config, capabilities)."""
        return (
            self.id == other.id
            and self.kind == other.kind
            and self.inputs == other.inputs
            and self.outputs == other.outputs
            and self.engine == other.engine
            and dict(self.config) == dict(other.config)
            and self.caps == other.caps
            and self.items == other.items
            and self.part == other.part
        )


def kind_node(node_id: str, kind: PrimitiveKind, engine: str, config: Mapping[str, Any] | None = None) -> Node:
    """A node with `kind`'s own ports and capabilities, to call an engine outside a graph (profiling, demos).

    Only for kinds whose ports are fixed: an LLM decode's ports depend on what it parses.
    """
    spec = spec_of(kind)
    assert spec.inputs is not None and spec.outputs is not None, f"{kind.value} has no fixed ports"
    return Node(node_id, kind, spec.inputs, spec.outputs, engine=engine, config=config or {}, caps=spec.caps)


@dataclass(frozen=True)
class ItemSlice:
    """Select items [start, stop) of a list value travelling along an edge.

    `stop=None` means "to the end": the last stage of a split takes every remaining
    item, so a split stays exact when the run-time count exceeds the build-time estimate.
    """

    start: int
    stop: int | None

    def apply(self, value: Any) -> Any:
        return value[self.start : self.stop]

    @classmethod
    def split(cls, items: int, size: int) -> list[ItemSlice]:
        """Consecutive slices of `size` covering `items` items, the last one open-ended."""
        size = max(1, size)
        return [cls(a, a + size if a + size < items else None) for a in range(0, items, size)]

    def count(self, items: int) -> int:
        """How many of `items` (the build-time count) this slice selects."""
        return (items if self.stop is None else min(self.stop, items)) - self.start


@dataclass(frozen=True)
class DataEdge:
    """Producer port -> consumer port. `select` narrows the value (stage slices)."""

    src: str
    src_port: str
    dst: str
    dst_port: str
    select: ItemSlice | None = None


@dataclass(frozen=True)
class ControlEdge:
    """Order only: `dst` waits for `src`.

    With `branch` set, `src` is a condition and `dst` runs only if the condition chose
    that branch; otherwise `dst` (and what needs its data) is skipped. `pinned` marks an
    order the user asked for (a side effect); dependency pruning keeps guards and pinned
    edges and drops the rest (module order that no data needs).
    """

    src: str
    dst: str
    branch: int | None = None
    pinned: bool = False

    @property
    def prunable(self) -> bool:
        return self.branch is None and not self.pinned
