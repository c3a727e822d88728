"""Optimization passes (p-graph -> e-graph) and the manager that runs them to a fixed point.

Typical use, with the engines' latency profiles:

    from teola_core.passes import PassContext, PassManager
    e_graph = PassManager().optimize(p_graph, PassContext.of(engines)).e_graph
"""

from teola_core.passes.base import Pass, PassContext
from teola_core.passes.decode_pipelining import DecodePipelining
from teola_core.passes.manager import OptimizationResult, PassManager, default_passes, run_passes
from teola_core.passes.prefill_split import PrefillSplit
from teola_core.passes.pruning import DependencyPruning
from teola_core.passes.rerank_prescoring import RerankPrescoring
from teola_core.passes.stage_decomposition import StageDecomposition

__all__ = [
    "DecodePipelining",
    "DependencyPruning",
    "OptimizationResult",
    "Pass",
    "PassContext",
    "PassManager",
    "PrefillSplit",
    "RerankPrescoring",
    "StageDecomposition",
    "default_passes",
    "run_passes",
]
