"""The reference evaluator: runs a graph one primitive at a time, in topological order.

It defines what a graph computes. The passes are tested against it (optimized and
unoptimized graphs give equal outputs) and the schedulers' runtime is tested against it
(same outputs, whatever the interleaving). It is not fast and not meant to be.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from teola_core.engines.protocol import Call, EngineSet, StreamResult
from teola_core.ir.errors import GraphError, PrimitiveError
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import Placement, PrimitiveKind, spec_of
from teola_core.runtime.engine_free import gather_inputs, run_inline, run_user


async def evaluate(
    graph: Graph, inputs: Mapping[str, Any], engines: EngineSet, query_id: str = "q0", context: Any = None
) -> dict[str, Any]:
    values: dict[tuple[str, str], Any] = {}
    skipped: set[str] = set()
    chosen: dict[str, int] = {}
    streamed: dict[str, list[Any]] = {}  # partial-decode group -> parsed items
    streamed_text: dict[str, Any] = {}
    result: dict[str, Any] = {}

    for node_id in graph.topological_order:
        node = graph.nodes[node_id]
        if _skipped(graph, node_id, skipped, chosen):
            skipped.add(node_id)
            continue
        args = gather_inputs(graph, node_id, values)
        try:
            if node.kind == PrimitiveKind.INPUT:
                name = node.config["name"]
                if name not in inputs:
                    raise GraphError(f"query input {name!r} is missing (graph {graph.name!r} needs it)")
                outputs: Mapping[str, Any] = {"value": inputs[name]}
            elif node.kind == PrimitiveKind.OUTPUT:
                result = args
                outputs = {}
            elif node.kind == PrimitiveKind.PARTIAL_DECODE:
                part = node.part
                assert part is not None  # validated: every partial decode has its part
                if part.group not in streamed:
                    streamed_text[part.group], streamed[part.group] = await _stream(
                        node, args, engines, query_id, context
                    )
                outputs = {"items": part.chunk(streamed[part.group])}
                if node.output_port("text") is not None:
                    outputs = {**outputs, "text": streamed_text[part.group]}
            elif spec_of(node.kind).placement == Placement.INLINE:
                outputs = run_inline(node, args)
            elif spec_of(node.kind).placement == Placement.USER:
                outputs = await run_user(node, args)
            else:
                assert node.engine is not None
                outputs = await engines[node.engine].run_one(Call(query_id, node, args, context))
        except GraphError:
            raise
        except Exception as exc:  # re-raised with the primitive named
            raise PrimitiveError(query_id, node.describe(), exc) from exc
        if node.kind == PrimitiveKind.CONDITION:
            chosen[node_id] = outputs["branch"]
        for port, value in outputs.items():
            values[(node_id, port)] = value
    return result


def _skipped(graph: Graph, node_id: str, skipped: set[str], chosen: dict[str, int]) -> bool:
    # Only guards skip: a plain order edge from a skipped node just means "after".
    for c in graph.control_in(node_id):
        if c.branch is not None and (c.src in skipped or chosen.get(c.src) != c.branch):
            return True
    node = graph.nodes[node_id]
    optional = {p.name for p in node.inputs if p.optional}
    return any(e.src in skipped and e.dst_port not in optional for e in graph.data_in(node_id))


async def _stream(
    node: Any, args: dict[str, Any], engines: EngineSet, query_id: str, context: Any
) -> tuple[Any, list[Any]]:
    unit = node.config["split_unit"]
    parser = unit.parser()
    text, items = "", []
    final: Any = None
    async for delta in engines[node.engine].stream(Call(query_id, node, args, context)):
        if isinstance(delta, StreamResult):
            final = delta
            continue
        text += delta
        items.extend(parser.feed(delta))
    items.extend(parser.close())
    return (text if final is None else final.value), items
