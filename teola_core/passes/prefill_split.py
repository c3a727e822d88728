"""Prefill split: prefill the part of a prompt that is ready while upstream work runs.

A prompt such as "instructions {question} context: {context}" has its leading part
ready long before retrieval produces `context`. The pass estimates when each template
variable becomes available (the longest path, in profiled latency, from the graph's
inputs to the variable's producer) and prefills early the longest *prefix* of the
template whose variables are all ready strictly before the latest one. Causal attention
allows only a prefix: the prompt is never reordered.

    format(t) -> prefill -> decode            becomes
    format/prefix(t, prefix_segments=k) -> prefill/partial ┐
    format(t) ------------------------------------------> prefill (full_prefill) -> decode

The full prefill keeps the original id, so its consumers need no rewiring. A prompt made
by a step Teola does not compute (a framework's prompt object, which must run itself)
carries a `PromptPlan` on its prefill (`config["prompt_plan"]`): the template and where
each variable comes from; the prefix FORMAT then reads those sources directly.

Only where it pays, when the LLM's profile has a `prefill` curve: prefilling k tokens
early saves about `k * slope` on the critical path (the curve's slope at its long end)
and costs an extra step, `prefill(k)` against the `k * slope` the full prefill would
have spent on them. It splits when `2 * k * slope >= prefill(k)`; k counts the words of
the prefix's literal text plus, for each ready variable, the words its producing step
usually writes when that was learned (`ctx.output_words`; else 0: a variable's length is
unknown before the query runs), so a short instruction before a question stays one
prefill on an engine with a per-step floor (the paper's 7B: ~15 ms a step, ~0.26 ms a
token, so ~60 tokens) while a long user document before the retrieved context is split.

How early is early enough: a split needs the prefix ready at least
`ctx.min_overlap_s` before the latest variable (by `estimates.finish_times`: profiled
engines, and app steps' observed run times); a shorter overlap would not pay for the
warm-up's own round trip. Nothing known about the producers: everything is ready at 0,
no split.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from teola_core.ir.graph import Graph, GraphEditor
from teola_core.ir.kinds import PortSpec, PrimitiveKind, spec_of
from teola_core.ir.node import ControlEdge, DataEdge, Node
from teola_core.ir.prompt import PromptPlan, Segment
from teola_core.ir.types import PortType
from teola_core.passes.base import Pass, PassContext
from teola_core.passes.estimates import LATENCY_KEY, estimated_latency, finish_times

__all__ = ["PrefillSplit", "estimated_latency", "finish_times"]


def _pays(prefix: Sequence[Segment], var_words: Mapping[str, int], engine: str | None, ctx: PassContext) -> bool:
    """Does prefilling the prefix early save more than its extra step costs (see the module doc)?
    `var_words`: the learned length of a ready variable's text, by variable."""
    profile = ctx.profiles.get(engine) if engine is not None else None
    curve = profile.curves.get("prefill") if profile is not None else None
    if curve is None:
        return True  # nothing known: split, as the paper does
    tokens = sum(len(seg.text.split()) if seg.var is None else var_words.get(seg.var, 0) for seg in prefix)
    (x0, y0), (x1, y1) = ((0.0, 0.0), *curve.points)[-2:]
    slope = (y1 - y0) / (x1 - x0)
    return tokens > 0 and 2 * tokens * slope >= curve.latency(tokens)


def _var_words(graph: Graph, sources: Mapping[str, tuple[str, str]], ctx: PassContext) -> dict[str, int]:
    """Each variable's learned text length, by the app step that writes it (where known)."""
    out: dict[str, int] = {}
    for var, (node, _) in sources.items():
        key = graph.nodes[node].config.get(LATENCY_KEY)
        if isinstance(key, str) and key in ctx.output_words:
            out[var] = ctx.output_words[key]
    return out


class PrefillSplit(Pass):
    name = "prefill-split"

    def run(self, graph: Graph, ctx: PassContext) -> Graph:
        finish: dict[str, float] | None = None
        editor: GraphEditor | None = None
        for node_id in graph.topological_order:
            prefill = graph.nodes[node_id]
            if prefill.kind != PrimitiveKind.PREFILL:
                continue
            source = self._prompt_source(graph, prefill)
            if source is None:
                continue
            template, sources, fmt = source
            finish = finish if finish is not None else finish_times(graph, ctx)
            ready = {var: finish[node] for var, (node, _) in sources.items()}
            k = self._ready_prefix(template, ready, ctx.min_overlap_s)
            if k is None or not _pays(template.segments[:k], _var_words(graph, sources, ctx), prefill.engine, ctx):
                continue
            editor = editor or graph.edit()
            self._rewrite(graph, editor, prefill, template, sources, fmt, k)
        return graph if editor is None else editor.freeze()

    @staticmethod
    def _prompt_source(graph: Graph, prefill: Node) -> tuple[Any, dict[str, tuple[str, str]], Node | None] | None:
        """(template, variable -> (node, port), the FORMAT node if any) of a prefill's prompt."""
        plan = prefill.config.get("prompt_plan")
        if isinstance(plan, PromptPlan):
            return plan.template, {var: (node, port) for var, node, port in plan.sources}, None
        prompt_edge = next((e for e in graph.data_in(prefill.id) if e.dst_port == "prompt"), None)
        if prompt_edge is None or prompt_edge.select is not None:
            return None
        fmt = graph.nodes[prompt_edge.src]
        if fmt.kind != PrimitiveKind.FORMAT or fmt.config.get("prefix_segments") is not None:
            return None
        sources = {e.dst_port: (e.src, e.src_port) for e in graph.data_in(fmt.id) if e.select is None}
        if len(sources) != len(graph.data_in(fmt.id)):
            return None
        return fmt.config["template"], sources, fmt

    @staticmethod
    def _ready_prefix(template: Any, ready: dict[str, float], min_overlap: float = 0.0) -> int | None:
        """How many leading segments are ready at least `min_overlap` before the latest variable
        (None: no split)."""
        segments = template.segments
        if not any(seg.var is not None for seg in segments):
            return None
        latest = max(ready.get(seg.var, 0.0) for seg in segments if seg.var is not None)
        k = 0
        for seg in segments:
            if (0.0 if seg.var is None else ready.get(seg.var, 0.0)) > latest - max(min_overlap, 1e-12):
                break
            k += 1
        return k if 0 < k < len(segments) else None

    def _rewrite(
        self,
        graph: Graph,
        editor: GraphEditor,
        prefill: Node,
        template: Any,
        sources: dict[str, tuple[str, str]],
        fmt: Node | None,
        k: int,
    ) -> None:
        prefix_vars = template.prefix(k).variables
        prefix_fmt = Node(
            id=editor.fresh_id(f"{fmt.id if fmt is not None else prefill.id}/prefix"),
            kind=PrimitiveKind.FORMAT,
            inputs=tuple(PortSpec(v, PortType.ANY) for v in prefix_vars),
            outputs=spec_of(PrimitiveKind.FORMAT).outputs or (),
            config={"template": template, "prefix_segments": k},
            module=prefill.module,
            label=prefill.label,
        )
        editor.add_node(prefix_fmt)
        for var in prefix_vars:
            node, port = sources[var]
            editor.connect(DataEdge(node, port, prefix_fmt.id, var))
        for c in graph.control_in(fmt.id if fmt is not None else prefill.id):
            editor.connect(ControlEdge(c.src, prefix_fmt.id, c.branch, c.pinned))

        partial_spec = spec_of(PrimitiveKind.PARTIAL_PREFILL)
        partial = Node(
            id=editor.fresh_id(f"{prefill.id}/partial"),
            kind=PrimitiveKind.PARTIAL_PREFILL,
            inputs=partial_spec.inputs or (),
            outputs=partial_spec.outputs or (),
            engine=prefill.engine,
            config=prefill.config,
            caps=prefill.caps,
            items=prefill.items,
            module=prefill.module,
            label=prefill.label,
        )
        editor.add_node(partial)
        editor.connect(DataEdge(prefix_fmt.id, "prompt", partial.id, "prefix"))
        for c in graph.control_in(prefill.id):
            editor.connect(ControlEdge(c.src, partial.id, c.branch, c.pinned))

        full_spec = spec_of(PrimitiveKind.FULL_PREFILL)
        editor.replace_node(replace(prefill, kind=PrimitiveKind.FULL_PREFILL, inputs=full_spec.inputs or ()))
        editor.connect(DataEdge(partial.id, "kv", prefill.id, "prefix_kv"))
        late = list(dict.fromkeys(seg.var for seg in template.segments[k:] if seg.var is not None))
        editor.note(
            f"{self.name}: {prefill.describe()} prefills the first {k} of {len(template.segments)} prompt "
            f"segments early (variables {list(prefix_vars)}) via {partial.id}; the rest waits for {late}"
        )
