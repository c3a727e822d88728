"""The systems a benchmark compares, as configurations of one runtime on the same engines.

| system         | graph                       | embed requests of 10 | engine batching            | prefix cache |
|----------------|-----------------------------|----------------------|----------------------------|--------------|
| teola          | e-graph (every pass)        | no: as profiled      | topology-aware             | on           |
| async_chain    | module chain                | gathered (async)     | server-side, dynamic, FIFO | on           |
| async_parallel | independent modules at once | gathered (async)     | server-side, dynamic, FIFO | on           |
| llamadist_po   | module chain                | one after another    | per invocation (PO)        | off          |
| llamadist_to   | module chain                | one after another    | fixed max batch, FIFO (TO) | off          |
| llamadistpc_po | independent modules at once | one after another    | per invocation (PO)        | on           |
| llamadistpc_to | independent modules at once | one after another    | fixed max batch, FIFO (TO) | on           |

`async_*` are what users run today: async LangChain / LlamaIndex (`aget_text_embedding_batch`
gathers its requests; LCEL's `RunnableParallel` and LlamaIndex's async executor run
independent modules together) on vLLM (automatic prefix caching on by default,
continuous batching, one request per LLM call) and an embedding / rerank server that
batches whatever requests wait when it frees up (TEI). `llamadist*` are the paper's
baselines, kept as the paper ran them (`paper=True`).
"""

from __future__ import annotations

from dataclasses import dataclass

from teola_benchmarks.framework_requests import FrameworkRequests
from teola_core.passes import default_passes
from teola_core.passes.base import Pass
from teola_core.passes.pruning import DependencyPruning

# The paper's TO: pre-tuned fixed batch sizes (items for embed/ingest/search/rerank, sequences for the LLM).
TO_MAX_BATCH: dict[str, int | None] = {"embedder": 64, "vectordb": 64, "reranker": 64, "llm": 32}
# What the servers of today's baselines batch: an embedding / rerank server takes every waiting
# request within its token budget (TEI's default 16,384 tokens: 64 of our ~100-token chunks fit);
# vLLM takes every request into its continuous batch, so the runtime forwards all that is ready.
SERVER_MAX_BATCH: dict[str, int | None] = {"embedder": 64, "vectordb": 64, "reranker": 64, "llm": None}


@dataclass(frozen=True)
class System:
    name: str
    passes: str  # "none", "pruning" or "all"
    policy: str
    prefix_cache: bool
    embed_requests: str | None = None  # None (as the graph says), "sequential" or "gathered"
    batch_caps: dict[str, int | None] | None = None  # per-engine max batch (None: the engines' profiles)
    paper: bool = False

    def pass_list(self) -> list[Pass]:
        framework: list[Pass] = []
        if self.embed_requests is not None:
            framework.append(FrameworkRequests(gathered=self.embed_requests == "gathered"))
        if self.passes == "none":
            return framework
        if self.passes == "pruning":
            return [*framework, DependencyPruning()]
        return [*framework, *default_passes()]

    def max_batch(self) -> dict[str, int | None] | None:
        return dict(self.batch_caps) if self.batch_caps is not None else None


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        System("teola", "all", "topology", True),
        System("async_chain", "none", "fifo", True, "gathered", SERVER_MAX_BATCH),
        System("async_parallel", "pruning", "fifo", True, "gathered", SERVER_MAX_BATCH),
        System("llamadist_po", "none", "po", False, "sequential", paper=True),
        System("llamadist_to", "none", "to", False, "sequential", TO_MAX_BATCH, paper=True),
        System("llamadistpc_po", "pruning", "po", True, "sequential", paper=True),
        System("llamadistpc_to", "pruning", "to", True, "sequential", TO_MAX_BATCH, paper=True),
    )
}
BASELINES = tuple(name for name in SYSTEMS if name != "teola")
