"""The pass manager: run passes in order, round after round, to a fixed point.

A round runs every enabled pass once, in order. Rounds repeat until one changes
nothing (every pass returned the very graph it was given). After every pass that
changed the graph, the graph is validated and its output node must still take the same
ports: a pass may restructure how outputs are computed, never what is output. Any
failure is raised as `PassError` naming the pass, chained from its cause; nothing is
swallowed, so there is never a half-rewritten graph.

    manager = PassManager()                       # the default pipeline
    manager.disable("prefill-split")
    manager.register(MyPass(), before="decode-pipelining")
    result = manager.optimize(p_graph, PassContext.of(engines))
    result.e_graph, result.applied               # graph, ("dependency-pruning", ...)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from teola_core.ir.errors import PassError
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import PortSpec
from teola_core.ir.validate import validate
from teola_core.passes.base import Pass, PassContext
from teola_core.passes.decode_pipelining import DecodePipelining
from teola_core.passes.prefill_split import PrefillSplit
from teola_core.passes.pruning import DependencyPruning
from teola_core.passes.rerank_prescoring import RerankPrescoring
from teola_core.passes.stage_decomposition import StageDecomposition

if TYPE_CHECKING:
    from teola_core.profiles.profile import LatencyProfile


def default_passes() -> list[Pass]:
    """Fresh instances of the paper's four passes, in its order, with rerank pre-scoring
    before the splits (it reads the ingest and searches whole)."""
    return [DependencyPruning(), RerankPrescoring(), StageDecomposition(), PrefillSplit(), DecodePipelining()]


@dataclass(frozen=True)
class OptimizationResult:
    """p_graph: the input. e_graph: the optimized graph.

    applied: the name of each pass run that changed the graph, in order (a pass appears
    once per round in which it changed something). notes: what the passes did.
    """

    p_graph: Graph
    e_graph: Graph
    applied: tuple[str, ...]
    rounds: int

    @property
    def notes(self) -> tuple[str, ...]:
        return self.e_graph.notes[len(self.p_graph.notes) :]


class PassManager:
    """Ordered passes, each on or off by name, run to a fixed point."""

    def __init__(
        self, passes: Sequence[Pass] | None = None, *, disabled: Iterable[str] = (), max_rounds: int = 8
    ) -> None:
        if max_rounds < 1:
            raise ValueError(f"max_rounds must be at least 1, got {max_rounds}")
        self._passes: list[Pass] = []
        self._disabled: set[str] = set()
        self.max_rounds = max_rounds
        for pass_ in default_passes() if passes is None else passes:
            self.register(pass_)
        for name in disabled:
            self.disable(name)

    @property
    def names(self) -> tuple[str, ...]:
        """Every registered pass, in run order (enabled or not)."""
        return tuple(p.name for p in self._passes)

    @property
    def enabled(self) -> tuple[str, ...]:
        return tuple(p.name for p in self._passes if p.name not in self._disabled)

    def register(self, pass_: Pass, *, before: str | None = None, after: str | None = None) -> PassManager:
        """Add a pass (last, or just before/after a named one). Names must be unique."""
        if not isinstance(pass_, Pass):
            raise TypeError(f"register() takes a Pass, got {type(pass_).__name__}")
        if pass_.name in self.names:
            raise ValueError(f"a pass named {pass_.name!r} is already registered")
        if before is not None and after is not None:
            raise ValueError("register() takes before= or after=, not both")
        if before is not None:
            self._passes.insert(self._index(before), pass_)
        elif after is not None:
            self._passes.insert(self._index(after) + 1, pass_)
        else:
            self._passes.append(pass_)
        return self

    def enable(self, name: str) -> PassManager:
        self._index(name)
        self._disabled.discard(name)
        return self

    def disable(self, name: str) -> PassManager:
        self._index(name)
        self._disabled.add(name)
        return self

    def _index(self, name: str) -> int:
        for i, p in enumerate(self._passes):
            if p.name == name:
                return i
        raise KeyError(f"no pass named {name!r} (registered: {', '.join(self.names) or 'none'})")

    def optimize(self, graph: Graph, ctx: PassContext | None = None) -> OptimizationResult:
        """Run the enabled passes to a fixed point; the input graph is validated first."""
        ctx = ctx or PassContext()
        validate(graph)
        outputs = (graph.output_node.id, graph.output_node.inputs)
        passes = [p for p in self._passes if p.name not in self._disabled]
        current = graph
        applied: list[str] = []
        changed: list[str] = []
        for round_ in range(1, self.max_rounds + 1):
            changed = []
            for pass_ in passes:
                result = self._run_one(pass_, current, ctx, outputs)
                if result is not current:
                    changed.append(pass_.name)
                    current = result
            applied.extend(changed)
            if not changed:
                return OptimizationResult(graph, current, tuple(applied), round_)
        raise PassError(
            changed[0],
            f"graph still changing after {self.max_rounds} rounds (changed in the last round: "
            f"{', '.join(changed)}); a pass must return the same graph object when it has nothing to do",
        )

    @staticmethod
    def _run_one(pass_: Pass, graph: Graph, ctx: PassContext, outputs: tuple[str, tuple[PortSpec, ...]]) -> Graph:
        try:
            result = pass_.run(graph, ctx)
        except PassError:
            raise
        except Exception as exc:
            raise PassError(pass_.name, f"failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(result, Graph):
            raise PassError(pass_.name, f"returned {type(result).__name__}, not a Graph")
        if result is graph:
            return graph
        try:
            validate(result)
        except Exception as exc:
            raise PassError(pass_.name, f"left an invalid graph: {exc}") from exc
        if (result.output_node.id, result.output_node.inputs) != outputs:
            raise PassError(pass_.name, f"changed the output node (ports were {[p.name for p in outputs[1]]})")
        return result


def run_passes(
    graph: Graph, passes: bool | PassManager, profiles: Mapping[str, LatencyProfile]
) -> tuple[Graph, list[str]]:
    """The e-graph for a drop-in's `passes` option, and what the passes did.

    `passes`: True (the default pipeline), False (none) or a `PassManager`; `profiles`
    are the engines' latency profiles (by engine name) the passes plan with.
    """
    if passes is False:
        return graph, ["(passes disabled)"]
    if passes is not True and not isinstance(passes, PassManager):
        raise TypeError(f"passes takes True, False or a PassManager, not {passes!r}")
    manager = passes if isinstance(passes, PassManager) else PassManager()
    result = manager.optimize(graph, PassContext(profiles=dict(profiles)))
    return result.e_graph, [*(f"applied {name}" for name in result.applied), *result.notes]
