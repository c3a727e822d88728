"""Run the core's pass pipeline on a traced graph (no LlamaIndex import).

Same contract as the LangChain adapter: `passes` is True (the default pipeline), False
(none) or a `PassManager`; the engines' latency profiles let the passes plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from teola_core.engines.protocol import EngineSet
from teola_core.ir.graph import Graph
from teola_core.passes import PassContext, PassManager
from teola_core.profiles.profile import LatencyProfile


def optimize_graph(
    pgraph: Graph, passes: Any, engines: EngineSet, profiles: Mapping[str, LatencyProfile] | None = None
) -> tuple[Graph, list[str]]:
    """The e-graph of `pgraph` and what the passes did (`profiles` override the engines')."""
    if passes is False:
        return pgraph, ["(passes disabled)"]
    manager = passes if isinstance(passes, PassManager) else PassManager()
    result = manager.optimize(pgraph, PassContext(profiles={**engines.profiles(), **(profiles or {})}))
    return result.e_graph, [*(f"applied {name}" for name in result.applied), *result.notes]
