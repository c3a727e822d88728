"""LlamaIndex adapter: run QueryPipelines and query engines as Teola graphs, same results.

    from teola_llamaindex import optimize
    fast = optimize(pipeline)                  # QueryPipeline (llama-index-core <= 0.12)
    fast.run(input="...") == pipeline.run(input="...")
    fast = optimize(index.as_query_engine())   # RetrieverQueryEngine (0.12 and 0.14)
    str(fast.query("...")) == str(engine.query("..."))
    fast = optimize(workflow)                  # Workflow: same run(...), model calls on Teola
    await fast.run(topic="...") == await workflow.run(topic="...")
    fast = optimize(agent)                     # FunctionAgent / ReActAgent: see `agents`

Needs `llama-index-core` (`pip install 'teola[llamaindex]'`).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from teola_llamaindex.common import OpaqueModuleWarning
from teola_llamaindex.query_engine import TeolaQueryEngine
from teola_llamaindex.workflows import TeolaWorkflow, Workflow

# QueryPipeline is gone from llama-index-core 0.13 on: there the executor is None.
if importlib.util.find_spec("llama_index.core.query_pipeline") is not None:
    from llama_index.core.query_pipeline import QueryPipeline

    from teola_llamaindex.pipeline import TeolaQueryPipelineExecutor
else:
    QueryPipeline = None  # type: ignore[assignment,misc]
    TeolaQueryPipelineExecutor = None  # type: ignore[assignment,misc]


def optimize(obj: Any, **options: Any) -> Any:
    """The Teola drop-in for a `QueryPipeline`, a `Workflow` or a `RetrieverQueryEngine`."""
    if isinstance(obj, Workflow):
        from teola_llamaindex.agents import TeolaAgent, is_workflow_agent  # agents are workflows

        return TeolaAgent(obj, **options) if is_workflow_agent(obj) else TeolaWorkflow(obj, **options)
    if QueryPipeline is not None and isinstance(obj, QueryPipeline):
        return TeolaQueryPipelineExecutor(obj, **options)
    return TeolaQueryEngine(obj, **options)


__all__ = ["OpaqueModuleWarning", "TeolaQueryEngine", "TeolaQueryPipelineExecutor", "TeolaWorkflow", "optimize"]
