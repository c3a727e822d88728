"""How the baselines' framework sends embedding work: requests of `embed_batch_size` texts.

    embed(48)  --FrameworkRequests(10)-->  embed/r0[0:10] -> embed/r1[10:20] -> ... -> embed/r4[40:] -> embed/agg
    embed(48)  --FrameworkRequests(10, gathered=True)-->  the same five requests, sent together

LlamaIndex embeds a module's texts in requests of `embed_batch_size` (default 10): its
sync `get_text_embedding_batch` sends each when the previous one returned (the paper's
LlamaDist), its async `aget_text_embedding_batch` gathers them (what async apps run
today). The engine sees those requests, not the module's whole batch: the per-request
batching the paper contrasts with app-aware batching. A baseline-only rewrite; Teola
sends a module's items as the engine's profile says (stage decomposition).
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
    """Cut each EMBED node of more than `request_items` items into requests of at most that many.

    A node's `items` says how big a request it is, so the requests themselves are never
    cut again (the pass reaches its fixed point at once). `gathered`: the requests go
    out together (async); else each waits for the one before (a pinned order, sync).
    """

    name = "framework-requests"

    def __init__(self, request_items: int = LLAMAINDEX_EMBED_BATCH_SIZE, *, gathered: bool = False) -> None:
        if request_items < 1:
            raise ValueError(f"request_items must be >= 1, got {request_items}")
        self.request_items = request_items
        self.gathered = gathered

    def run(self, graph: Graph, ctx: PassContext) -> Graph:
        current = graph
        for node_id in graph.topological_order:
            node = current.nodes.get(node_id)
            if node is None or node.kind != PrimitiveKind.EMBED or node.items is None:
                continue
            if node.items > self.request_items:
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
        if not self.gathered:
            for first, then in pairwise(parts):
                editor.connect(ControlEdge(first, then, pinned=True))
        how = "together" if self.gathered else "one after another"
        editor.note(f"{self.name}: {node.describe()} sent as {n} requests of <= {size} items, {how}")
        return editor.freeze()
