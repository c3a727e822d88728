"""What explain() tells a user about a plan: what Teola expects to gain, and what blocks more.

`report(...)` reads a plan: the critical path of the chain as LangChain runs it (the
p-graph) against Teola's plan (the e-graph), by the profiles (given, the engines' own,
learned), and, for every model whose prompt is not split and every map that is not
pipelined, why not and what would change it.

    sections = report(first_plan, plan, engines, calls, on_graph, learn_after, not_learning)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from teola_core.engines.protocol import EngineSet
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.prompt import PromptPlan
from teola_core.passes.base import PassContext
from teola_core.passes.estimates import LATENCY_KEY, critical_path, estimated_latency, finish_times, serial_time
from teola_core.profiles.profile import LatencyProfile
from teola_langchain.engines import LangChainLLMEngine
from teola_langchain.tracing.keys import CHAIN, short


@dataclass(frozen=True)
class Expected:
    """Seconds one query takes alone, by the profiles."""

    langchain: float  # the p-graph's critical path: LangChain runs parallel branches at once
    teola: float  # the e-graph's
    serial: float  # every step after the one before


def expected(pgraph: Graph, egraph: Graph, profiles: Mapping[str, LatencyProfile]) -> Expected:
    ctx = PassContext(profiles=profiles)
    return Expected(critical_path(pgraph, ctx), critical_path(egraph, ctx), serial_time(pgraph, ctx))


def unmeasured(graphs: Sequence[Graph], profiles: Mapping[str, LatencyProfile]) -> list[str]:
    """Steps the plan needs a time for and has none (they count as 0 s)."""
    ctx = PassContext(profiles=profiles)
    found: dict[str, None] = {}
    for graph in graphs:
        for node in graph.nodes.values():
            key = node.config.get(LATENCY_KEY)
            if isinstance(key, str) and estimated_latency(node, ctx) == 0.0:
                found[short(key)] = None
    return list(found)


def seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def measured(profiles: Mapping[str, LatencyProfile], key: str) -> float | None:
    profile = profiles.get(key)
    if profile is None or "run" not in profile.curves:
        return None
    return profile.latency("run", 1)


def prefill_blockers(
    pgraph: Graph, egraph: Graph, profiles: Mapping[str, LatencyProfile], min_overlap: float, warms: Any
) -> list[str]:
    """For each model prompt of the graph: why its ready start is not prefilled early (or why it
    is, but gains nothing). `warms(engine_name) -> str | None`: why that engine cannot warm."""
    ctx = PassContext(profiles=profiles, min_overlap_s=min_overlap)
    finish = finish_times(pgraph, ctx)
    split = {n.id for n in egraph.nodes.values() if n.kind == PrimitiveKind.FULL_PREFILL}
    out = []
    for node in pgraph.nodes.values():
        if node.kind != PrimitiveKind.PREFILL:
            continue
        decode = next((pgraph.nodes[e.dst] for e in pgraph.data_out(node.id)), node)
        model = short(str(decode.config.get(LATENCY_KEY, node.label)))
        plan = node.config.get("prompt_plan")
        if node.id in split:
            cannot = warms(node.engine)
            if cannot is not None:
                out.append(f"- {model}: its prompt's start is ready early, but {cannot}")
            continue
        late_prompt = max((finish[p] for p in pgraph.predecessors(node.id)), default=0.0) >= min_overlap
        if not isinstance(plan, PromptPlan):
            if not late_prompt:  # the prompt is ready at once: there is nothing to overlap it with
                continue
            out.append(
                f"- {model}: no start of its prompt is known to be ready early: the prompt is not a template fed "
                'by a dict of separately computed fields (as in `{"context": retriever, "question": ...} | prompt`)'
            )
            continue
        ready = {var: finish[src] for var, src, _ in plan.sources}
        late = max(ready, key=lambda v: ready[v]) if ready else None
        first = next((s.var for s in plan.template.segments if s.var is not None), None)
        if late is None:
            continue
        source = dict((v, s) for v, s, _ in plan.sources)[late]
        slowest = _slowest_before(pgraph, source, ctx)
        if ready[late] - min(ready.values()) < min_overlap and len(ready) > 1:
            missing = list(
                dict.fromkeys(short(k) for _, src, _ in plan.sources for k in _slowest_before(pgraph, src, ctx)[1])
            )
            why = (
                f"the time of {_some(missing)} is not known yet (learned after a few calls)"
                if missing
                else f"its variables are all ready within {seconds(min_overlap)} of each other: nothing to overlap"
            )
            out.append(f"- {model}: its prompt is not warmed early: {why}")
        elif first == late and any(ready[late] - t >= min_overlap for t in ready.values()):
            out.append(
                f"- {model}: its prompt starts with {{{late}}}, the variable that comes last"
                + (f" (from {short(slowest[0])})" if slowest[0] else "")
                + ": put what is ready early (instructions, the question, a user's document) before it"
            )
    return out


def _some(names: Sequence[str], most: int = 4) -> str:
    more = f"; and {len(names) - most} more" if len(names) > most else ""
    return "; ".join(names[:most]) + more


def _slowest_before(graph: Graph, node_id: str, ctx: PassContext) -> tuple[str | None, list[str]]:
    """The slowest timed step among `node_id` and its ancestors, and the ones with no time yet."""
    seen, stack = set(), [node_id]
    best: tuple[float, str | None] = (0.0, None)
    unknown = []
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        node = graph.nodes[current]
        key = node.config.get(LATENCY_KEY)
        if isinstance(key, str):
            t = estimated_latency(node, ctx)
            if t == 0.0:
                unknown.append(key)
            elif t > best[0]:
                best = (t, key)
        stack.extend(graph.predecessors(current))
    return best[1], unknown


def engine_notes(engines: EngineSet, used: set[str]) -> list[str]:
    """Engines whose calls go one by one, and why that may be what blocks batching (embeddings, reranks)."""
    out = []
    for name in sorted(used):
        engine = engines[name]
        kinds = engine.kinds
        if engine.limits.max_batch_items == 1 and PrimitiveKind.EMBED in kinds:
            out.append(
                f"- {name}: embeddings are sent per query (Teola has not proven that this class embeds a "
                "batch of documents as it embeds each query), so concurrent queries do not share a batch"
            )
        if engine.limits.max_batch_items == 1 and PrimitiveKind.RERANK in kinds:
            out.append(
                f"- {name}: reranks are sent per query (its cross encoder's class is not registered as scoring "
                "each pair on its own: teola_langchain.register_per_pair_cross_encoder), so concurrent queries "
                "do not share a model call"
            )
    return out


def measured_line(profiles: Mapping[str, LatencyProfile], calls: int, on_graph: int) -> str | None:
    chain = measured(profiles, CHAIN)
    if chain is None:
        return None
    return f"- measured: {seconds(chain)} median over the last calls ({calls} observed, {on_graph} on Teola's graph)"


def report(
    first: Any, plan: Any, engines: EngineSet, calls: int, on_graph: int, learn_after: int, not_learning: str | None
) -> list[tuple[str, str]]:
    """explain()'s advising sections: (title, body) pairs. `first`, `plan`: the plan made at
    optimize() and the current one (`plans.Plan`)."""
    now = expected(plan.traced.main.pgraph, plan.traced.main.graph, plan.profiles)
    before = expected(first.traced.main.pgraph, first.traced.main.graph, plan.profiles)
    gains = _prefill_gains(plan.traced, plan.profiles, engines)
    saved = sum(g for g, _ in gains)
    saved_before = sum(g for g, _ in _prefill_gains(first.traced, plan.profiles, engines))
    lines = [
        f"- as LangChain runs it: {seconds(now.langchain)} on the critical path "
        f"({seconds(now.serial)} if every step ran after the one before)",
        f"- on Teola's plan: {seconds(max(0.0, now.teola - saved))}"
        + "".join(f"; {text}" for _, text in gains)
        + (
            " (a saving is estimated once the model has warmed on the graph and its engine has a profile "
            "with a prefill curve)"
            if any(g == 0.0 for g, _ in gains)
            else ""
        ),
    ]
    if first is not plan:
        applied = [p.removeprefix("applied ") for sub in first.traced.graphs() for p in sub.passes]
        what = "; ".join(dict.fromkeys(p for p in applied if " " not in p)) or "none"
        lines.append(
            f"- the plan made at optimize(), before anything was learned (passes applied: {what}): "
            f"{seconds(max(0.0, before.teola - saved_before))} by today's figures"
        )
    elif not_learning is None:
        lines.append(
            f"- nothing learned yet ({calls} calls so far): the plan is made again with what the calls "
            f"teach from call {learn_after} on"
        )
    else:
        lines.append(f"- learning is off ({not_learning}): the plan uses the given profiles only")
    seen = measured_line(plan.profiles, calls, on_graph)
    if seen:
        lines.append(seen)
    missing = unmeasured([sub.graph for sub in plan.traced.graphs()], plan.profiles)
    if missing:
        lines.append("- no time known yet for (counted as 0 s): " + _some(missing))
    blocked = [
        f"- {short(k)}: runs as one call ({info.opaque}). {info.advice}"
        for k, info in plan.traced.steps.items()
        if info.opaque is not None
    ]
    blocked += [f"- {short(b.key)}: {b.why}. To change it: {b.advice}" for b in plan.traced.blocked]
    for sub in plan.traced.graphs():
        blocked += prefill_blockers(
            sub.pgraph, sub.graph, plan.profiles, PassContext().min_overlap_s, _warm_reason(engines)
        )
    used = {n.engine for sub in plan.traced.graphs() for n in sub.graph.nodes.values() if n.engine is not None}
    blocked += engine_notes(engines, used)
    return [
        ("expected time of one query alone (by the profiles)", "\n".join(lines)),
        ("what blocks a speedup, and what would help", "\n".join(blocked) or "- nothing found"),
    ]


def _warm_reason(engines: EngineSet) -> Any:
    def why(name: str | None) -> str | None:
        engine = engines[name] if name is not None else None
        if isinstance(engine, LangChainLLMEngine) and engine.warmer is None:
            return (
                f"{name} has no server Teola can warm (a langchain-openai ChatOpenAI/OpenAI with a base_url to a "
                "vLLM server, or engines=[(model, VLLMHTTPEngine(...))]), so the split gains nothing"
            )
        return None

    return why


def _prefill_gains(traced: Any, profiles: Mapping[str, LatencyProfile], engines: EngineSet) -> list[tuple[float, str]]:
    """What each warmed prompt start is expected to save: min(its prefill, the overlap), when known."""
    out: list[tuple[float, str]] = []
    ctx = PassContext(profiles=profiles)
    for sub in traced.graphs():
        finish = finish_times(sub.graph, ctx)
        for node in sub.graph.nodes.values():
            if node.kind != PrimitiveKind.PARTIAL_PREFILL or node.engine is None:
                continue
            engine = engines[node.engine]
            if isinstance(engine, LangChainLLMEngine) and engine.warmer is None:
                continue
            full = next(e.dst for e in sub.graph.data_out(node.id) if e.dst_port == "prefix_kv")
            overlap = max((finish[p] for p in sub.graph.predecessors(full) if p != node.id), default=0.0) - max(
                (finish[p] for p in sub.graph.predecessors(node.id)), default=0.0
            )
            stats = getattr(getattr(engine, "warmer", None), "stats", None)
            tokens = stats.warm_tokens / stats.warmups if stats is not None and stats.warmups else None
            profile = profiles.get(node.engine)
            if tokens is None or profile is None or "prefill" not in profile.curves:
                out.append((0.0, f"{node.engine} warms a prompt's ready start during {seconds(overlap)} of other work"))
                continue
            prefill = profile.latency("prefill", tokens)
            gain = min(prefill, overlap)
            out.append(
                (
                    gain,
                    f"{node.engine} warms its prompt's ready start (~{tokens:.0f} tokens, {seconds(prefill)} of "
                    f"prefill) during {seconds(overlap)} of other work: saves ~{seconds(gain)}",
                )
            )
    return out
