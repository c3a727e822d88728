"""The systems a benchmark compares, as configurations of one runtime on the same engines.

| system                   | graph                  | embed requests | engine batching            | prefix cache |
|--------------------------|------------------------|----------------|----------------------------|--------------|
| teola                    | e-graph (every pass)   | as profiled    | topology-aware             | on           |
| async_chain              | module chain           | 10, gathered   | server-side, dynamic, FIFO | on           |
| async_parallel           | independent at once    | 10, gathered   | server-side, dynamic, FIFO | on           |
| async_chain_langchain    | module chain           | 1000, gathered | server-side, dynamic, FIFO | on           |
| async_parallel_langchain | independent at once    | 1000, gathered | server-side, dynamic, FIFO | on           |
| llamadist_po             | module chain           | 10, in turn    | per invocation (PO)        | off          |
| llamadist_to             | module chain           | 10, in turn    | fixed max batch, FIFO (TO) | off          |
| llamadistpc_po           | independent at once    | 10, in turn    | per invocation (PO)        | on           |
| llamadistpc_to           | independent at once    | 10, in turn    | fixed max batch, FIFO (TO) | on           |

`async_*` are what users run today: async LangChain / LlamaIndex (LCEL's `RunnableParallel`
and LlamaIndex's async executor run independent modules together) on vLLM (automatic
prefix caching on by default, continuous batching, one request per LLM call) and an
embedding / rerank server that batches whatever requests wait when it frees up (TEI).
They differ in how a module's texts reach the embedding server: LlamaIndex's
`aget_text_embedding_batch` sends requests of `embed_batch_size` (10) together; LangChain's
`OpenAIEmbeddings.aembed_documents` sends requests of its `chunk_size` (1,000): a
document's chunks in one request (`*_langchain`). A headline is against the best of them.
`llamadist*` are the paper's baselines, kept as the paper ran them (`paper=True`).
"""

from __future__ import annotations

from dataclasses import dataclass

from teola_benchmarks.framework_requests import LLAMAINDEX_EMBED_BATCH_SIZE, FrameworkRequests
from teola_core.passes import default_passes
from teola_core.passes.base import Pass
from teola_core.passes.pruning import DependencyPruning

# The paper's TO: pre-tuned fixed batch sizes (items for embed/ingest/search/rerank, sequences for the LLM).
TO_MAX_BATCH: dict[str, int | None] = {"embedder": 64, "vectordb": 64, "reranker": 64, "llm": 32}
# What the servers of today's baselines batch: an embedding / rerank server takes every waiting
# request within its token budget (TEI's default 16,384 tokens: 64 of our ~100-token chunks fit);
# vLLM takes every request into its continuous batch, so the runtime forwards all that is ready.
SERVER_MAX_BATCH: dict[str, int | None] = {"embedder": 64, "vectordb": 64, "reranker": 64, "llm": None}
LANGCHAIN_CHUNK = 1000  # langchain-openai's `OpenAIEmbeddings.chunk_size`: texts per request


@dataclass(frozen=True)
class System:
    name: str
    passes: str  # "none", "pruning" or "all"
    policy: str
    prefix_cache: bool
    embed_requests: str | None = None  # None (as the graph says), "sequential" or "gathered"
    batch_caps: dict[str, int | None] | None = None  # per-engine max batch (None: the engines' profiles)
    embed_request_items: int = LLAMAINDEX_EMBED_BATCH_SIZE  # texts per embedding request
    paper: bool = False

    def pass_list(self) -> list[Pass]:
        framework: list[Pass] = []
        if self.embed_requests is not None:
            gathered = self.embed_requests == "gathered"
            framework.append(FrameworkRequests(self.embed_request_items, gathered=gathered))
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
        System("async_chain_langchain", "none", "fifo", True, "gathered", SERVER_MAX_BATCH, LANGCHAIN_CHUNK),
        System("async_parallel_langchain", "pruning", "fifo", True, "gathered", SERVER_MAX_BATCH, LANGCHAIN_CHUNK),
        System("llamadist_po", "none", "po", False, "sequential", paper=True),
        System("llamadist_to", "none", "to", False, "sequential", TO_MAX_BATCH, paper=True),
        System("llamadistpc_po", "pruning", "po", True, "sequential", paper=True),
        System("llamadistpc_to", "pruning", "to", True, "sequential", TO_MAX_BATCH, paper=True),
    )
}
BASELINES = tuple(name for name in SYSTEMS if name != "teola")
