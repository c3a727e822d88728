"""LlamaIndex adapter: run QueryPipelines and query engines as Teola graphs, same results.

    from teola_llamaindex import optimize
    fast = optimize(pipeline)                  # QueryPipeline (llama-index-core <= 0.12)
    fast.run(input="...") == pipeline.run(input="...")
    fast = optimize(index.as_query_engine())   # any query engine (RetrieverQueryEngine traced)
    str(fast.query("...")) == str(engine.query("..."))
    fast = optimize(workflow)                  # Workflow: same run(...), model calls on Teola
    await fast.run(topic="...") == await workflow.run(topic="...")
    fast = optimize(agent)                     # FunctionAgent / ReActAgent: see `agents`

Spans, events and callbacks are LlamaIndex's own (docs/llamaindex.md). Needs
`llama-index-core` (`pip install 'teola[llamaindex]'`).
"""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

from llama_index.core.base.base_query_engine import BaseQueryEngine

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
    """The Teola drop-in for a `QueryPipeline`, a `Workflow`, an agent or a query engine.

    Any other object is returned as it is, with a warning: Teola never refuses one.
    """
    if isinstance(obj, Workflow):
        from teola_llamaindex.agents import TeolaAgent, is_workflow_agent  # agents are workflows

        return TeolaAgent(obj, **options) if is_workflow_agent(obj) else TeolaWorkflow(obj, **options)
    if QueryPipeline is not None and isinstance(obj, QueryPipeline):
        return TeolaQueryPipelineExecutor(obj, **options)
    if isinstance(obj, BaseQueryEngine):
        return TeolaQueryEngine(obj, **options)
    warnings.warn(
        f"teola: {type(obj).__name__} runs as itself (teola optimizes QueryPipelines, query engines, "
        "workflows and agents)",
        OpaqueModuleWarning,
        stacklevel=2,
    )
    return obj


__all__ = ["OpaqueModuleWarning", "TeolaQueryEngine", "TeolaQueryPipelineExecutor", "TeolaWorkflow", "optimize"]
