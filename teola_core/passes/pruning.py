"""Dependency pruning: drop the module order that no data needs.

A module-by-module framework runs module i+1 after module i even when it reads nothing
module i produced (query expansion does not need the document index). The builder
records that order as prunable control edges; dropping them lets independent modules
run in parallel. Data edges already state every real dependency. Guards (a condition's
branch) and pinned edges (an order the user asked for, e.g. a side effect) are kept.
"""

from __future__ import annotations

from teola_core.ir.graph import Graph
from teola_core.passes.base import Pass, PassContext


class DependencyPruning(Pass):
    name = "dependency-pruning"

    def run(self, graph: Graph, ctx: PassContext) -> Graph:
        prunable = [c for c in graph.control_edges if c.prunable]
        if not prunable:
            return graph
        editor = graph.edit()
        for c in prunable:
            editor.disconnect(c)
            editor.note(f"{self.name}: dropped order edge {c.src} -> {c.dst} (no data flows along it)")
        return editor.freeze()
