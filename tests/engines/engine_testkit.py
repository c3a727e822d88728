"""Small helpers for the real-engine tests: nodes of a kind, and running a coroutine."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from teola_core.ir.kinds import PortSpec, PrimitiveKind, spec_of
from teola_core.ir.node import DecodePart, Node
from teola_core.ir.split_units import SplitUnit
from teola_core.ir.types import PortType

T = TypeVar("T")


def node(
    kind: PrimitiveKind,
    engine: str,
    *,
    node_id: str | None = None,
    split_unit: SplitUnit | None = None,
    part: DecodePart | None = None,
    **config: Any,
) -> Node:
    """A node of `kind` with the kind's ports (a decode gets `text`, and `items` with a split unit)."""
    spec = spec_of(kind)
    inputs = spec.inputs if spec.inputs is not None else (PortSpec("kv", PortType.KV),)
    if spec.outputs is not None:
        outputs = spec.outputs
    elif kind == PrimitiveKind.PARTIAL_DECODE:
        outputs = (PortSpec("items", PortType.ITEMS),)
    else:
        outputs = (PortSpec("text", PortType.TEXT),)
        if split_unit is not None:
            outputs = (*outputs, PortSpec("items", PortType.ITEMS))
    if split_unit is not None:
        config["split_unit"] = split_unit
    return Node(node_id or kind.value, kind, inputs, outputs, engine=engine, config=config, caps=spec.caps, part=part)


def run(coro: Coroutine[Any, Any, T], timeout: float = 180.0) -> T:
    """Run a coroutine with a time limit (a hung engine fails the test instead of the suite)."""

    async def guarded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(guarded())
