"""Decode pipelining: hand each generated item downstream while the LLM writes the rest.

An LLM call whose output is a list (a split unit declared on its decode) and that is
expected to produce n >= 2 items becomes a group of n PARTIAL_DECODE nodes over one
stream. Partial decode i hands on item i as soon as the parser has it; the last hands on
every remaining item (see `teola_core.ir.node.DecodePart`), so the chunks concatenate to
exactly the parsed list whatever the model produced. The item-wise consumers after the
decode are replicated per partial decode (`replication.fan_out`, shared with stage
decomposition) and joined by an AGGREGATE where the chain ends.

    decode(items, expected 3) -> embed -> search -> merge_hits      becomes
    decode/p0 -> embed/p0 -> search/p0 ┐
    decode/p1 -> embed/p1 -> search/p1 ├-> search/agg (concat) -> merge_hits
    decode/p2 -> embed/p2 -> search/p2 ┘

Decisions: the partial decodes are chained by *pinned* control edges p0 -> p1 -> ...
(their natural order; pinned so dependency pruning keeps them). The last partial decode
always declares a "text" output (the whole text), whether or not anything reads it, so
the shape of a pipelined group does not depend on its consumers. Replicated consumers
get `items=1` (one expected item per part); consumers whose other item inputs would
need a slice are not replicated, since chunk sizes are known only at run time.
"""

from __future__ import annotations

from dataclasses import replace

from teola_core.ir.graph import Graph
from teola_core.ir.kinds import Capabilities, PortSpec, PrimitiveKind
from teola_core.ir.node import ControlEdge, DataEdge, DecodePart, Node
from teola_core.ir.types import PortType
from teola_core.passes.base import Pass, PassContext
from teola_core.passes.replication import fan_out


class DecodePipelining(Pass):
    name = "decode-pipelining"

    def run(self, graph: Graph, ctx: PassContext) -> Graph:
        current = graph
        for node_id in graph.topological_order:
            node = graph.nodes[node_id]
            n = node.config.get("expected_items")
            if (
                node.kind != PrimitiveKind.DECODE
                or not node.caps.splittable
                or node.config.get("split_unit") is None
                or node.caps.item_output != "items"
                or node.output_port("items") is None
                or not isinstance(n, int)
                or n < 2
            ):
                continue
            current = self._pipeline(current, node, n)
        return current

    def _pipeline(self, graph: Graph, decode: Node, n: int) -> Graph:
        editor = graph.edit()
        kv_edges = editor.data_in(decode.id)
        parts: list[str] = []
        for i in range(n):
            outputs = [PortSpec("items", PortType.ITEMS)]
            if i == n - 1:
                outputs.append(PortSpec("text", PortType.TEXT))
            part = Node(
                id=editor.fresh_id(f"{decode.id}/p{i}"),
                kind=PrimitiveKind.PARTIAL_DECODE,
                inputs=decode.inputs,
                outputs=tuple(outputs),
                engine=decode.engine,
                config=decode.config,
                caps=Capabilities(batchable=decode.caps.batchable),
                module=decode.module,
                label=decode.label,
                part=DecodePart(decode.id, i, n),
            )
            editor.add_node(part)
            for e in kv_edges:
                editor.connect(replace(e, dst=part.id))
            if parts:
                editor.connect(ControlEdge(parts[-1], part.id, pinned=True))
            parts.append(part.id)

        for e in editor.data_out(decode.id):
            if e.src_port == "text":
                editor.disconnect(e)
                editor.connect(DataEdge(parts[-1], "text", e.dst, e.dst_port, e.select))
        done = fan_out(
            editor,
            graph.topological_order,
            decode,
            parts,
            ranges=None,
            part_items=[1] * n,
            suffix="p",
        )
        chain = "".join(f", {orig} x{len(p)}" for orig, p in done.replicated.items())
        joined = f"; joined by {', '.join(done.aggregates)}" if done.aggregates else ""
        editor.note(f"{self.name}: {decode.describe()} streams {n} expected items as partial decodes{chain}{joined}")
        return editor.freeze()
