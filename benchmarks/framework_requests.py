"""How the baselines' framework sends embedding work: fixed-size requests, one after another.

LlamaDist is a LlamaIndex-style module chain. LlamaIndex embeds a module's texts with
`BaseEmbedding.get_text_embedding_batch`: requests of `embed_batch_size` texts (the
default, `DEFAULT_EMBED_BATCH_SIZE`, is 10), each sent when the previous one returned.
The engine sees those requests, not the module's whole batch: that is the per-request
batching the paper contrasts with app-aware batching (its measured example: 48 chunks
take 1.8 s in requests of 4 and 1.35 s at 16). This pass rewrites a p-graph the way the
framework issues it, for the baseline systems only:

    embed(48)   becomes   embed/r0[0:10] -> embed/r1[10:20] -> ... -> embed/r4[40:]
                          (pinned order)                          -> embed/agg -> consumers

Teola's own passes never see this: Teola sends the module's items as the engine's
profile says (stage decomposition at the max efficient batch).
"""

from __future__ import annotations

from itertools import pairwise

from teola_core.ir.graph import Graph
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.node import ControlEdge, ItemSlice
from teola_core.passes.base import Pass, PassContext
from teola_core.passes.replication import fan_out, replicate

LLAMAINDEX_EMBED_BATCH_SIZE = 10


class FrameworkRequests(Pass):
    """Cut each EMBED node into sequential requests of at most `request_items` items."""

    name = "framework-requests"

    def __init__(self, request_items: int = LLAMAINDEX_EMBED_BATCH_SIZE) -> None:
        if request_items < 1:
            raise ValueError(f"request_items must be >= 1, got {request_items}")
        self.request_items = request_items

    def run(self, graph: Graph, ctx: PassContext) -> Graph:
        current = graph
        for node_id in graph.topological_order:
            node = current.nodes.get(node_id)
            if node is None or node.kind != PrimitiveKind.EMBED or node.items is None:
                continue
            if node.items <= self.request_items or "/r" in node.id:
                continue
            current = self._split(current, node_id)
        return current

    def _split(self, graph: Graph, node_id: str) -> Graph:
        node = graph.nodes[node_id]
        assert node.items is not None
        size = self.request_items
        n = -(-node.items // size)
        ranges = [ItemSlice(i * size, (i + 1) * size if i < n - 1 else None) for i in range(n)]
        counts: list[int | None] = [min(size, node.items - i * size) for i in range(n)]
        editor = graph.edit()
        parts = replicate(editor, node, family={}, ranges=ranges, part_items=counts, suffix="r")
        fan_out(editor, (), node, parts, ranges=ranges, part_items=counts, suffix="r", total_items=node.items)
        for first, then in pairwise(parts):
            editor.connect(ControlEdge(first, then, pinned=True))
        editor.note(f"{self.name}: {node.describe()} sent as {n} sequential requests of <= {size} items")
        return editor.freeze()
