"""How a plan of a chain is made: trace it, run the passes with the profiles, and see what pays.

    planner = Planner(chain, EngineRegistry(), given={}, passes=True, execution="auto")
    plan = planner.plan(learned={}, counts={}, words={}, calls=0)
    plan.on_graph, plan.why      # whether calls run on Teola's graph, and what that gains

A plan runs calls on the graph only when that gains something over running the chain as
LangChain runs it (`_what_pays`): a pass that overlaps work, or an engine that batches
calls across queries; or when `execution="graph"` asks for it. When a new plan is made
is `replanning.py`'s business.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import Runnable

from teola_core.engines.protocol import EngineSet
from teola_core.ir.kinds import PrimitiveKind
from teola_core.profiles.learning import merged
from teola_core.profiles.profile import LatencyProfile
from teola_langchain.engines import EngineRegistry, LangChainLLMEngine
from teola_langchain.tracing.keys import last_name
from teola_langchain.tracing.session import TraceSession
from teola_langchain.tracing.traced import SubGraph, TracedChain
from teola_langchain.tracing.tracer import trace_in

_PAYING_PASSES = ("decode-pipelining", "stage-decomposition")


@dataclass(frozen=True)
class Plan:
    """One plan of the chain: what runs, whether calls run on the graph, and what it was planned with.

    profiles: every profile the passes read (given, the engines' own, learned);
    learned/counts/words: the learned figures among them (to tell when a new plan is due);
    calls: how many calls had been observed when it was made.
    """

    traced: TracedChain
    why: list[str]
    on_graph: bool
    profiles: Mapping[str, LatencyProfile]
    learned: Mapping[str, LatencyProfile]
    counts: Mapping[str, int]
    words: Mapping[str, int]
    calls: int
    given: frozenset[str] = frozenset()  # the keys of the given profiles (the engines' own included)


@dataclass(frozen=True)
class Planner:
    """What every plan of one chain is made from (the `optimize()` options that shape a plan).

    given: the profiles given to `optimize()` (by engine name, step key or step name);
    passes: True (the default pipeline), False (none) or a `PassManager`;
    execution: "auto" or "graph" (see `TeolaRunnable`).
    """

    chain: Runnable[Any, Any]
    engines: EngineRegistry
    given: Mapping[str, LatencyProfile]
    passes: Any
    execution: str
    timeout: float | None = None
    expected_items: int | None = None

    def plan(
        self,
        learned: Mapping[str, LatencyProfile],
        counts: Mapping[str, int],
        words: Mapping[str, int],
        calls: int,
        *,
        warn: bool = False,
    ) -> Plan:
        """Trace the chain and optimize it with the given, the engines' and the learned profiles."""
        session = TraceSession(
            self.engines, warn=warn, expected_items=self.expected_items, counts=counts.get if counts else None
        )
        traced = trace_in(session, self.chain)
        given = {**self.engines.engines.profiles(), **_by_key(self.given, traced.steps)}
        profiles = merged(given, learned)
        for sub in traced.graphs():
            _optimize_graph(sub, self.passes, profiles, words)
        why = _what_pays(traced, self.engines.engines)
        if self.timeout is not None:
            why.append(f"every step and engine call has a {self.timeout} s deadline")
        on_graph = self.execution == "graph" or bool(why)
        return Plan(traced, why, on_graph, profiles, learned, counts, words, calls, frozenset(given))


def _what_pays(plan: TracedChain, engines: EngineSet) -> list[str]:
    """What running on the graph gains over running the chain as LangChain does (empty: nothing).

    A pass that overlaps work (a sequence step that starts before the step ahead ends is
    dependency pruning), or an engine that batches calls across queries. A chain of
    framework calls that each run alone gains nothing from being scheduled, so it is not.
    A prefill split pays only on an engine that prefills a prompt's start for real (not a
    LangChain model with no server to warm: its early prefill is bookkeeping).
    """
    gains = [
        f"prefill-split on {sub.name} ({', '.join(sorted(warmed))})"
        for sub in plan.graphs()
        if (warmed := {n.engine for n in sub.graph.nodes.values() if _warms(n, engines)})
    ]
    gains += [
        f"{name} on {sub.name}"
        for sub in plan.graphs()
        for name in _PAYING_PASSES
        if any(p == f"applied {name}" for p in sub.passes)
    ]
    gains += [f"dependency pruning: {note.step} starts early" for note in plan.early if note.early]
    used = {n.engine for sub in plan.graphs() for n in sub.graph.nodes.values() if n.engine is not None}
    for name in sorted(used):
        if engines[name].limits.max_batch_items != 1:
            gains.append(f"{name} batches calls across queries")
    return gains


def _warms(node: Any, engines: EngineSet) -> bool:
    """A partial prefill on an engine that computes it (see `_what_pays`)."""
    if node.kind != PrimitiveKind.PARTIAL_PREFILL or node.engine is None:
        return False
    engine = engines[node.engine]
    return not isinstance(engine, LangChainLLMEngine) or engine.warmer is not None


def _by_key(given: Mapping[str, LatencyProfile], steps: Mapping[str, str]) -> dict[str, LatencyProfile]:
    """Given profiles by the keys the plan uses: a step may be named by its own run name when
    no other step has that name (`keys.last_name`); any other name is used as it is."""
    out: dict[str, LatencyProfile] = {}
    for name, profile in given.items():
        if name in steps or ":" in name:
            out[name] = profile
            continue
        matches = [key for key in steps if last_name(key) == name]
        if len(matches) > 1:
            raise ValueError(
                f"profiles=: {len(matches)} steps are named {name!r}; give one of their keys instead: "
                + ", ".join(matches)
            )
        out[matches[0] if matches else name] = profile
    return out


def _optimize_graph(
    sub: SubGraph, passes: Any, profiles: Mapping[str, LatencyProfile], words: Mapping[str, int]
) -> None:
    """Run the pass pipeline on one traced graph."""
    if passes is False:
        sub.passes = ["(passes disabled)"]
        return
    from teola_core.passes import PassContext, PassManager

    manager = passes if isinstance(passes, PassManager) else PassManager()
    result = manager.optimize(sub.pgraph, PassContext(profiles=profiles, output_words=words))
    sub.graph = result.e_graph
    sub.passes = [*(f"applied {name}" for name in result.applied), *result.notes]
