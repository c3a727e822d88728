"""How long a graph's nodes are expected to take, from latency profiles (given or learned).

A node's estimate, in order:

1. an engine primitive whose engine has a profile with that op: `profile.latency(op,
   items or 1)` (partial/full prefills use the `prefill` curve, partial decodes the
   `decode` curve); a decode is charged one step per `max_tokens`, as the `decode`
   curve is the latency of one step;
2. a node that stands for a step of the app (`config[LATENCY_KEY]`, set by a framework
   adapter: a user's step, a model's call, a map over a body) whose key has a profile
   with a `run` curve: that step's whole run, as observed;
3. otherwise 0 (inline work, or nothing known).

A decode that has both takes the larger: the step's observed run is the model's whole call
(its prompt's prefill included), which an engine curve charged per output token cannot
know at plan time. A partial decode is 1/count of its decode: the stream's items share
one generation.

    finish = finish_times(graph, ctx)          # when each node's outputs are ready
    critical_path(graph, ctx), serial_time(graph, ctx)
"""

from __future__ import annotations

from teola_core.ir.graph import Graph
from teola_core.ir.kinds import DECODE_KINDS, Placement, PrimitiveKind, spec_of
from teola_core.ir.node import Node
from teola_core.passes.base import PassContext

LATENCY_KEY = "latency_key"  # node config: the profile key of the app step the node runs
RUN = "run"  # the op of a step's whole run in a learned profile

_OP = {
    PrimitiveKind.PARTIAL_PREFILL: PrimitiveKind.PREFILL.value,
    PrimitiveKind.FULL_PREFILL: PrimitiveKind.PREFILL.value,
    PrimitiveKind.PARTIAL_DECODE: PrimitiveKind.DECODE.value,
}


def _share(node: Node) -> float:
    """The part of its decode's time a partial decode stands for."""
    if node.kind != PrimitiveKind.PARTIAL_DECODE or node.part is None:
        return 1.0
    return 1.0 / max(1, node.part.count)


def engine_latency(node: Node, ctx: PassContext) -> float | None:
    """The engine profile's estimate for the node (None: no engine, or no such curve)."""
    if spec_of(node.kind).placement != Placement.ENGINE or node.engine is None:
        return None
    profile = ctx.profiles.get(node.engine)
    op = _OP.get(node.kind, node.kind.value)
    if profile is None or op not in profile.curves:
        return None
    seconds = profile.latency(op, node.items or 1)
    if node.kind in DECODE_KINDS:
        seconds *= max(1, int(node.config.get("max_tokens", 1)))
    return seconds * _share(node)


def step_latency(node: Node, ctx: PassContext) -> float | None:
    """The observed (or given) run time of the app step the node stands for, if known."""
    key = node.config.get(LATENCY_KEY)
    profile = ctx.profiles.get(key) if isinstance(key, str) else None
    if profile is None or RUN not in profile.curves:
        return None
    return profile.latency(RUN, 1) * _share(node)


def estimated_latency(node: Node, ctx: PassContext) -> float:
    """Seconds the node is expected to run alone (0 when nothing is known about it)."""
    seconds = engine_latency(node, ctx)
    if seconds is None or node.kind in DECODE_KINDS:
        seconds = max(seconds or 0.0, step_latency(node, ctx) or 0.0)
    return seconds


def finish_times(graph: Graph, ctx: PassContext) -> dict[str, float]:
    """Estimated time each node's outputs are ready: the longest path from the inputs."""
    finish: dict[str, float] = {}
    for node_id in graph.topological_order:
        start = max((finish[p] for p in graph.predecessors(node_id)), default=0.0)
        finish[node_id] = start + estimated_latency(graph.nodes[node_id], ctx)
    return finish


def critical_path(graph: Graph, ctx: PassContext) -> float:
    """Seconds one query takes alone, by the estimates: the longest path through the graph."""
    return max(finish_times(graph, ctx).values(), default=0.0)


def serial_time(graph: Graph, ctx: PassContext) -> float:
    """Seconds one query takes if every node runs after the one before: the sum of the estimates."""
    return sum(estimated_latency(n, ctx) for n in graph.nodes.values())


def unknown_nodes(graph: Graph, ctx: PassContext) -> list[Node]:
    """Nodes that run an engine or an app step and have no estimate (they count as 0)."""
    return [
        n
        for n in graph.nodes.values()
        if (n.engine is not None or LATENCY_KEY in n.config)
        and engine_latency(n, ctx) is None
        and step_latency(n, ctx) is None
    ]
