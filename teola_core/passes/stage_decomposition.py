"""Stage decomposition (paper Algorithm 1): cut an oversized batch into pipelined stages.

A batchable, splittable primitive whose `items` exceed its engine's max efficient batch
(from the engine's latency profile) gains nothing from running as one batch: past that
size throughput stops growing and the consumers wait for the whole batch. It is cut
into ceil(items / meb) stages of meb items (the last takes the rest), and the item-wise
consumers after it are replicated per stage (see `replication.fan_out`), so stage i of
the consumer runs while stage i+1 of the producer runs. An AGGREGATE joins the stages
where the chain ends.

    embed(48 chunks, meb 16) -> ingest        becomes
    embed/s0[0:16] -> ingest/s0 ┐
    embed/s1[16:32] -> ingest/s1 ├-> ingest/agg (barrier) -> ...
    embed/s2[32:]  -> ingest/s2 ┘

Only where it pays: by the profiles, the stages pipelined into the item-wise consumers
must finish before one batch followed by the consumers would, by more than the extra
engine time the stages take (past the max efficient batch, k small batches still cost
a little more than one big one, and under load other queries queue behind that extra
time). With a cheap consumer, or none, one batch wins. Without a profile for the node
or a consumer, it splits, as the paper does.

Decisions: the last stage's slice is open-ended (`ItemSlice(start, None)`), so no item
is lost when the run-time count exceeds the build-time `items`. A replicated consumer
whose own max efficient batch is smaller than its stage is cut again (nested stages,
`search/s0/s1`) within the same run, so the pass is idempotent. LLM kinds are never
split here (decode pipelining handles decodes), nor speculative nodes (rerank
pre-scoring sizes its pieces itself).
"""

from __future__ import annotations

from teola_core.ir.graph import Graph
from teola_core.ir.kinds import LLM_KINDS
from teola_core.ir.node import ItemSlice, Node
from teola_core.ir.speculation import speculation_of
from teola_core.passes.base import Pass, PassContext
from teola_core.passes.replication import compose, fan_out, outputs_mergeable, replicate


class StageDecomposition(Pass):
    name = "stage-decomposition"

    def run(self, graph: Graph, ctx: PassContext) -> Graph:
        current = graph
        while (found := self._candidate(current, ctx)) is not None:
            current = self._split(current, *found)
        return current

    def _candidate(self, graph: Graph, ctx: PassContext) -> tuple[Node, int] | None:
        """The first node (topological order) worth splitting, with its engine's meb."""
        for node_id in graph.topological_order:
            node = graph.nodes[node_id]
            caps = node.caps
            if node.kind in LLM_KINDS or node.items is None or speculation_of(node) is not None:
                continue  # a speculative node stays whole: the pass that made it sized it
            if not (caps.batchable and caps.splittable and caps.item_inputs):
                continue
            meb = ctx.max_efficient_batch(node.engine, node.kind.value)
            if meb is None:
                continue
            meb = max(1, meb)
            if node.items <= meb:
                continue
            if not outputs_mergeable(node, {e.src_port for e in graph.data_out(node_id)}):
                continue
            if not _pays(graph, node, meb, ctx):
                continue
            probe = ItemSlice(0, meb)
            if any(e.dst_port in caps.item_inputs and compose(e.select, probe) is None for e in graph.data_in(node_id)):
                continue  # negative slices on its inputs: stage bounds cannot be stated
            return node, meb
        return None

    def _split(self, graph: Graph, node: Node, meb: int) -> Graph:
        assert node.items is not None
        ranges = ItemSlice.split(node.items, meb)
        counts: list[int | None] = [r.count(node.items) for r in ranges]
        n = len(ranges)
        editor = graph.edit()
        parts = replicate(editor, node, family={}, ranges=ranges, part_items=counts, suffix="s")
        done = fan_out(
            editor,
            graph.topological_order,
            node,
            parts,
            ranges=ranges,
            part_items=counts,
            suffix="s",
            total_items=node.items,
        )
        chain = "".join(f", {orig} x{len(p)}" for orig, p in done.replicated.items())
        joined = f"; joined by {', '.join(done.aggregates)}" if done.aggregates else ""
        editor.note(
            f"{self.name}: split {node.describe()} ({node.items} items, max efficient batch {meb}) "
            f"into {n} stages{chain}{joined}"
        )
        return editor.freeze()


def _pays(graph: Graph, node: Node, meb: int, ctx: PassContext) -> bool:
    """Would the stages, pipelined into the item-wise consumers, finish sooner than one batch,
    by more than the extra engine time they take?

    One query alone, by the profiles: stage i of each consumer starts when stage i of the
    node and stage i-1 of that consumer are done. Unknown latencies: True (split).
    """
    assert node.items is not None
    consumers = {
        e.dst: graph.nodes[e.dst]
        for e in graph.data_out(node.id)
        if graph.nodes[e.dst].items is not None and e.dst_port in graph.nodes[e.dst].caps.item_inputs
    }

    def cost(n: Node, items: int) -> float | None:
        return ctx.latency(n.engine, n.kind.value, items)

    whole = cost(node, node.items)
    whole_after = [cost(c, node.items) for c in consumers.values()]
    sizes = [min(meb, node.items - start) for start in range(0, node.items, meb)]
    stages = [cost(node, size) for size in sizes]
    stage_after = {cid: [cost(c, size) for size in sizes] for cid, c in consumers.items()}
    if whole is None or None in whole_after or None in stages or any(None in v for v in stage_after.values()):
        return True
    one_batch = whole + max((x for x in whole_after if x is not None), default=0.0)
    produced, finished = 0.0, dict.fromkeys(consumers, 0.0)
    for i, stage in enumerate(stages):
        produced += stage or 0.0
        for cid, after in stage_after.items():
            finished[cid] = max(produced, finished[cid]) + (after[i] or 0.0)
    pipelined = max(finished.values(), default=produced)
    extra_work = produced - whole  # engine time the stages cost beyond one batch: others queue behind it
    return pipelined + extra_work <= one_batch  # a tie splits, as the paper does
