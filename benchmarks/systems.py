"""The systems a benchmark compares, as configurations of one runtime.

All run on the same simulated engines. What differs is what the paper varies:

| system          | graph                           | engine batching            | prefix cache |
|-----------------|---------------------------------|----------------------------|--------------|
| llamadist_po    | module chain, no passes         | per invocation (PO)        | off          |
| llamadist_to    | module chain, no passes         | fixed max batch, FIFO (TO) | off          |
| llamadistpc_po  | independent modules in parallel | per invocation (PO)        | on           |
| llamadistpc_to  | independent modules in parallel | fixed max batch, FIFO (TO) | on           |
| teola           | all four passes (e-graph)       | topology-aware             | on           |

The four baselines embed as their framework does (`FrameworkRequests`: LlamaIndex's
requests of 10 texts, one after another); `framework_requests=False` gives the idealized
baseline that sends a module's texts as one request (the figures before 0.2 in README).
"""

from __future__ import annotations

from dataclasses import dataclass

from teola_benchmarks.framework_requests import FrameworkRequests
from teola_core.passes import default_passes
from teola_core.passes.base import Pass
from teola_core.passes.pruning import DependencyPruning

# TO's pre-tuned fixed batch sizes (items for embed/ingest/search/rerank, sequences for the LLM).
TO_MAX_BATCH = {"embedder": 64, "vectordb": 64, "reranker": 64, "llm": 32}


@dataclass(frozen=True)
class System:
    name: str
    passes: str  # "none", "pruning" or "all"
    policy: str
    prefix_cache: bool
    framework_requests: bool = False

    def pass_list(self) -> list[Pass]:
        framework: list[Pass] = [FrameworkRequests()] if self.framework_requests else []
        if self.passes == "none":
            return framework
        if self.passes == "pruning":
            return [*framework, DependencyPruning()]
        return [*framework, *default_passes()]

    def max_batch(self) -> dict[str, int] | None:
        """Per-engine batch caps: TO's fixed sizes; None lets the runtime use profiles."""
        return dict(TO_MAX_BATCH) if self.policy == "to" else None


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        System("teola", "all", "topology", True),
        System("llamadist_po", "none", "po", False, framework_requests=True),
        System("llamadist_to", "none", "to", False, framework_requests=True),
        System("llamadistpc_po", "pruning", "po", True, framework_requests=True),
        System("llamadistpc_to", "pruning", "to", True, framework_requests=True),
    )
}
