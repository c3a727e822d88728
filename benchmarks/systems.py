"""The systems a benchmark compares, as configurations of one runtime.

All run on the same simulated engines. What differs is what the paper varies:

| system          | graph                           | engine batching            | prefix cache |
|-----------------|---------------------------------|----------------------------|--------------|
| llamadist_po    | module chain, no passes         | per invocation (PO)        | off          |
| llamadist_to    | module chain, no passes         | fixed max batch, FIFO (TO) | off          |
| llamadistpc_po  | independent modules in parallel | per invocation (PO)        | on           |
| llamadistpc_to  | independent modules in parallel | fixed max batch, FIFO (TO) | on           |
| teola           | all four passes (e-graph)       | topology-aware             | on           |
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def pass_list(self) -> list[Pass]:
        if self.passes == "none":
            return []
        if self.passes == "pruning":
            return [DependencyPruning()]
        return list(default_passes())

    def max_batch(self) -> dict[str, int] | None:
        """Per-engine batch caps: TO's fixed sizes; None lets the runtime use profiles."""
        return dict(TO_MAX_BATCH) if self.policy == "to" else None


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        System("teola", "all", "topology", True),
        System("llamadist_po", "none", "po", False),
        System("llamadist_to", "none", "to", False),
        System("llamadistpc_po", "pruning", "po", True),
        System("llamadistpc_to", "pruning", "to", True),
    )
}
