"""What the primitives that need no engine compute, shared by every runtime.

Inline primitives (format, aggregate, input, output) are cheap and pure; user
primitives (call, condition) run the user's code. Engine primitives are computed by
engines (`teola_core.engines`), never here.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from typing import Any

from teola_core.ir.graph import Graph
from teola_core.ir.kinds import MergeMode, PrimitiveKind
from teola_core.ir.node import DecodePart, Node
from teola_core.ir.types import Scored


def gather_inputs(graph: Graph, node_id: str, values: Mapping[tuple[str, str], Any]) -> dict[str, Any]:
    """The node's input values from its producers' outputs (slices applied).

    Inputs whose producer has no value (skipped by a condition) are left out.
    """
    gathered: dict[str, Any] = {}
    for e in graph.data_in(node_id):
        key = (e.src, e.src_port)
        if key in values:
            value = values[key]
            gathered[e.dst_port] = e.select.apply(value) if e.select else value
    return gathered


def run_inline(node: Node, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Compute a format, aggregate or output primitive."""
    if node.kind == PrimitiveKind.FORMAT:
        template = node.config["template"]
        k = node.config.get("prefix_segments")
        if k is not None:
            template = template.prefix(k)
        return {"prompt": template.render(inputs)}
    if node.kind == PrimitiveKind.AGGREGATE:
        parts = [inputs[p.name] for p in node.inputs if p.name in inputs]
        return {"value": aggregate(MergeMode(node.config["mode"]), parts, node.config.get("top_k"), node.id)}
    if node.kind == PrimitiveKind.OUTPUT:
        return {}
    raise TypeError(f"{node.describe()} is not an inline primitive")


def aggregate(mode: MergeMode, parts: list[Any], top_k: int | None, node_id: str = "aggregate") -> Any:
    """Join the outputs of a split primitive's stages (see `MergeMode`)."""
    if mode == MergeMode.CONCAT:
        return [item for part in parts for item in part]
    if mode == MergeMode.TOPK:
        merged: list[Scored] = [item for part in parts for item in part]
        merged.sort(key=lambda s: -s.score)  # stable: ties keep stage order, as unsplit
        return merged if top_k is None else merged[:top_k]
    if mode == MergeMode.BARRIER:
        return parts[0]
    if mode == MergeMode.SELECT:
        if len(parts) != 1:
            raise ValueError(f"aggregate {node_id!r} (select) got {len(parts)} branch values; exactly one expected")
        return parts[0]
    raise ValueError(f"aggregate {node_id!r}: unknown mode {mode!r}")


async def run_user(node: Node, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Run a call's function or a condition's predicate.

    Coroutine functions are awaited; plain functions run in a worker thread (they may
    block) unless the node's config says `inline=True` (cheap, non-blocking).
    """
    if node.kind == PrimitiveKind.CONDITION:
        branch = await _invoke(node, node.config["predicate"], (inputs["value"],), {})
        branches = node.config.get("branches")
        if not isinstance(branch, int) or (branches is not None and not 0 <= branch < branches):
            raise ValueError(f"condition {node.id!r} returned {branch!r}; expected a branch index below {branches}")
        return {"branch": branch}
    if node.kind == PrimitiveKind.CALL:
        result = await _invoke(node, node.config["fn"], (), dict(inputs))
        ports = [p.name for p in node.outputs]
        if len(ports) == 1:
            return {ports[0]: result}
        if not isinstance(result, Mapping) or not set(ports) <= set(result):
            raise TypeError(f"call {node.id!r} must return a mapping with keys {ports}, got {type(result).__name__}")
        return {p: result[p] for p in ports}
    raise TypeError(f"{node.describe()} is not a user primitive")


async def _invoke(node: Node, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    if node.config.get("inline", False):
        result = fn(*args, **kwargs)
    else:
        result = await asyncio.to_thread(fn, *args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


def decode_chunk(items: list[Any], index: int, count: int) -> list[Any]:
    """The items partial decode `index` of `count` hands on (see `DecodePart.chunk`)."""
    return DecodePart("", index, count).chunk(items)
