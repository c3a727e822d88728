"""LLM primitive nodes for engine tests: `prefill_node()`, `decode_node(max_tokens)`."""

from __future__ import annotations

from typing import Any

from teola_core.ir.kinds import Capabilities, PortSpec, PrimitiveKind, spec_of
from teola_core.ir.node import DecodePart, Node
from teola_core.ir.types import PortType


def prefill_node(kind: PrimitiveKind = PrimitiveKind.PREFILL, **config: Any) -> Node:
    spec = spec_of(kind)
    assert spec.inputs is not None and spec.outputs is not None
    return Node(kind.value, kind, spec.inputs, spec.outputs, engine="llm", config=config, caps=spec.caps)


def decode_node(
    max_tokens: int = 20,
    kind: PrimitiveKind = PrimitiveKind.DECODE,
    *,
    items: bool = False,
    part: DecodePart | None = None,
    **config: Any,
) -> Node:
    """A DECODE (with an `items` port when `items`) or a PARTIAL_DECODE (always with one, and its `part`)."""
    extra = (PortSpec("items", PortType.ITEMS),) if items or kind == PrimitiveKind.PARTIAL_DECODE else ()
    return Node(
        "decode",
        kind,
        (PortSpec("kv", PortType.KV),),
        (PortSpec("text", PortType.TEXT), *extra),
        engine="llm",
        config={"max_tokens": max_tokens, **config},
        caps=Capabilities(batchable=True),
        part=part,
    )
