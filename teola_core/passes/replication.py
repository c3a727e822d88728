"""Shared by stage decomposition and decode pipelining: fan a split downstream.

When a node is cut into parts (stages of a batch, or partial decodes of a stream), the
item-wise consumers after it can run per part too: part i of the consumer starts while
part i+1 of the producer still runs. `fan_out` replicates that chain of consumers, then
joins every part family where the chain ends with an AGGREGATE node (the merge mode each
node declares in `caps.merge`) and rewires the former consumers to it.

A consumer is replicated when it is batchable and splittable, can be merged, and
consumes a split value on one of its own `item_inputs`. Its other item-aligned inputs
must either be split values of the same family (part i takes part i) or, when the
parts' item ranges are known at build time (stages), come whole from elsewhere and get
the matching `ItemSlice`; its non-item inputs are passed whole.

    parts = replicate(editor, node, family={}, ranges=ranges, part_items=counts, suffix="s")
    fan_out(editor, graph.topological_order, node, parts, ranges=ranges, part_items=counts, suffix="s")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from teola_core.ir.graph import GraphEditor
from teola_core.ir.kinds import LLM_KINDS, MergeMode, PortSpec, PrimitiveKind, spec_of
from teola_core.ir.node import ControlEdge, DataEdge, ItemSlice, Node
from teola_core.ir.speculation import speculation_of
from teola_core.ir.types import PortType


def compose(outer: ItemSlice | None, inner: ItemSlice) -> ItemSlice | None:
    """`inner` applied after `outer`, as one slice; None if negative bounds forbid it."""
    if outer is None:
        return inner
    bounds = (outer.start, outer.stop, inner.start, inner.stop)
    if any(b is not None and b < 0 for b in bounds):
        return None
    start = outer.start + inner.start
    stops = [s for s in (outer.stop, None if inner.stop is None else outer.start + inner.stop) if s is not None]
    stop = min(stops) if stops else None
    return ItemSlice(start if stop is None else min(start, stop), stop)


def outputs_mergeable(node: Node, consumed_ports: set[str]) -> bool:
    """Can every consumed output of the node's parts be joined by its merge mode?

    The item output concatenates (or top-k merges) by position; any other output must be
    a value all parts share (`BARRIER`, e.g. the index every ingest stage wrote into).
    """
    if node.caps.merge is None:
        return False
    return all(p == node.caps.item_output or node.caps.merge == MergeMode.BARRIER for p in consumed_ports)


@dataclass(frozen=True)
class FanOut:
    """What `fan_out` did: the replicated nodes (original id -> parts) and the aggregates."""

    replicated: Mapping[str, tuple[str, ...]]
    aggregates: tuple[str, ...]


def replicate(
    editor: GraphEditor,
    node: Node,
    *,
    family: Mapping[str, tuple[str, ...]],
    ranges: Sequence[ItemSlice] | None,
    part_items: Sequence[int | None],
    suffix: str,
) -> tuple[str, ...]:
    """Add one copy of `node` per part, with its data inputs split accordingly.

    Inputs from a split node in `family` take that node's part i; other item inputs are
    sliced by `ranges[i]` (composed with the edge's own select); the rest pass whole.
    The copies keep everything of the original but their id and `items`.
    """
    parts: list[str] = []
    for i, items in enumerate(part_items):
        part = replace(node, id=editor.fresh_id(f"{node.id}/{suffix}{i}"), items=items)
        editor.add_node(part)
        for e in editor.data_in(node.id):
            if e.src in family:
                editor.connect(DataEdge(family[e.src][i], e.src_port, part.id, e.dst_port))
            elif e.dst_port in node.caps.item_inputs:
                assert ranges is not None, "item input without ranges; replicable() should have refused"
                select = compose(e.select, ranges[i])
                assert select is not None, "uncomposable select; replicable() should have refused"
                editor.connect(DataEdge(e.src, e.src_port, part.id, e.dst_port, select))
            else:
                editor.connect(DataEdge(e.src, e.src_port, part.id, e.dst_port, e.select))
        parts.append(part.id)
    return tuple(parts)


def _replicable(
    editor: GraphEditor,
    node: Node,
    family: Mapping[str, tuple[str, ...]],
    originals: Mapping[str, Node],
    ranges: Sequence[ItemSlice] | None,
    total_items: int | None,
) -> bool:
    caps = node.caps
    if node.kind in LLM_KINDS or not (caps.batchable and caps.splittable and caps.item_inputs):
        return False
    if speculation_of(node) is not None:
        return False  # its consumer waits on it by one edge; the pass that made it sized it
    if not outputs_mergeable(node, {e.src_port for e in editor.data_out(node.id)}):
        return False
    if total_items is not None and node.items is not None and node.items != total_items:
        return False  # declared item count disagrees with the split's: not item-aligned
    for e in editor.data_in(node.id):
        if e.src in family:
            source = originals[e.src]
            if e.src_port != source.caps.item_output or e.dst_port not in caps.item_inputs or e.select is not None:
                return False
        elif e.dst_port in caps.item_inputs and (ranges is None or any(compose(e.select, r) is None for r in ranges)):
            return False
    return True


def _aggregate_node(editor: GraphEditor, source: Node, port: str, parts: Sequence[str]) -> str:
    """An AGGREGATE joining `port` of every part, ports as the builder makes them."""
    mode = source.caps.merge
    assert mode is not None
    config: dict[str, object] = {"mode": mode}
    if mode == MergeMode.TOPK and source.config.get("top_k") is not None:
        config["top_k"] = source.config["top_k"]
    suffix = "agg" if port == source.caps.item_output or len(source.outputs) == 1 else f"agg.{port}"
    agg = Node(
        id=editor.fresh_id(f"{source.id}/{suffix}"),
        kind=PrimitiveKind.AGGREGATE,
        inputs=tuple(PortSpec(f"part_{i}", PortType.ANY) for i in range(len(parts))),
        outputs=spec_of(PrimitiveKind.AGGREGATE).outputs or (),
        config=config,
        module=source.module,
        label=source.label,
    )
    editor.add_node(agg)
    for i, part in enumerate(parts):
        editor.connect(DataEdge(part, port, agg.id, f"part_{i}"))
    return agg.id


def fan_out(
    editor: GraphEditor,
    order: Sequence[str],
    source: Node,
    parts: Sequence[str],
    *,
    ranges: Sequence[ItemSlice] | None,
    part_items: Sequence[int | None],
    suffix: str,
    total_items: int | None = None,
) -> FanOut:
    """Replace `source` (still in the editor) by its `parts` (already added, inputs wired).

    `order` is a topological order of the graph before the split; `ranges` the item
    range of each part when known at build time (None for partial decodes, whose items
    arrive at run time: consumers needing a slice of another input then stay whole).
    Control edges touching a replaced node are copied to (from) each of its parts, so
    order and guards hold for every part. `source` and the replicated originals are
    removed; every data edge they fed goes to part-wise copies or to an aggregate.
    """
    family: dict[str, tuple[str, ...]] = {source.id: tuple(parts)}
    originals: dict[str, Node] = {source.id: source}
    for node_id in order:
        node = editor.nodes.get(node_id)
        if node is None or node_id in family:
            continue
        if not any(e.src in family for e in editor.data_in(node_id)):
            continue
        if _replicable(editor, node, family, originals, ranges, total_items):
            family[node_id] = replicate(
                editor, node, family=family, ranges=ranges, part_items=part_items, suffix=suffix
            )
            originals[node_id] = node

    aggregates: dict[tuple[str, str], str] = {}
    for original_id, original_parts in family.items():
        for e in editor.data_out(original_id):
            editor.disconnect(e)
            if e.dst in family:
                continue  # the consumer's parts read this node's parts directly
            key = (original_id, e.src_port)
            if key not in aggregates:
                aggregates[key] = _aggregate_node(editor, originals[original_id], e.src_port, original_parts)
            editor.connect(DataEdge(aggregates[key], "value", e.dst, e.dst_port, e.select))

    for c in [c for c in editor.control_edges if c.src in family or c.dst in family]:
        editor.disconnect(c)
        for src in family.get(c.src, (c.src,)):
            for dst in family.get(c.dst, (c.dst,)):
                editor.connect(ControlEdge(src, dst, c.branch, c.pinned))
    for original_id in family:
        editor.remove_node(original_id)
    return FanOut(
        replicated={k: v for k, v in family.items() if k != source.id},
        aggregates=tuple(aggregates.values()),
    )
