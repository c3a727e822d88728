"""The calls of one optimized workflow: its engines, and each call's small graph at its step's depth.

`CallRouter` runs every call on the workflow drop-in's runtime of the running event loop,
shared by every run of the workflow, so concurrent runs' calls meet in the same engine
schedulers. A call arrives when its run began, so where calls wait (an engine at its
concurrency, an LLM whose vLLM-like server is full) the earliest run's go first; a call's
depth is its step's (`workflows.step_depths`), its graph nodes' `depth_cost`
(`node_depth`), by which the runtime's graph scheduler orders them.
"""

from __future__ import annotations

import contextvars
import itertools
from collections.abc import Callable
from typing import Any

from teola_core.engines.protocol import Engine, EngineSet
from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.errors import PrimitiveError
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import PortSpec, PrimitiveKind
from teola_core.ir.node import Node
from teola_core.ir.types import PortType
from teola_core.runtime.backends import RuntimePerLoop
from teola_llamaindex.common import unwrap_error

try:  # the workflow library's per-step context: which step is running (for the depth)
    from workflows.runtime.types.results import StepWorkerStateContextVar as _STEP_CONTEXT
except ImportError:  # another workflows release: every call gets the workflow's full depth
    _STEP_CONTEXT = None

_DEPTH = "teola_depth"  # node config entry: this node's share of the call's depth


def node_depth(node: Node) -> float:
    """Depth cost of a node: what the graph builder stored, 0 for input/output nodes."""
    return float(node.config.get(_DEPTH, 0.0))


class CallRouter:
    """Engines and call graphs of one optimized workflow; `runtimes` (the drop-in's, set once
    its engines are placed) run the calls."""

    def __init__(self, depths: dict[str, int]) -> None:
        self.engines = EngineSet()
        self.runtimes: RuntimePerLoop | None = None
        self.depths = depths
        self.max_depth = max(depths.values(), default=1)
        self.run_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("teola_workflow_run", default=None)
        # when the run began (the runtimes' clock, monotonic): its calls' arrival, so the
        # engine schedulers serve earlier runs' calls first (program-level order)
        self.run_started: contextvars.ContextVar[float | None] = contextvars.ContextVar(
            "teola_workflow_started", default=None
        )
        self._graphs: dict[tuple[str, ...], Graph] = {}
        self._ids = itertools.count()

    def register(self, component: object, role: str, make: Callable[[str], Engine]) -> str:
        """The engine of `component` in `role` (one per object and role, named after its class)."""
        return self.engines.engine_for(component, role, make)

    def graphs(self) -> dict[tuple[str, ...], Graph]:
        """The call graphs made so far, by (kind, engine, depth, search engine)."""
        return dict(self._graphs)

    def depth(self) -> int:
        """The issuing step's depth (see the module docstring)."""
        state = _STEP_CONTEXT.get(None) if _STEP_CONTEXT is not None else None
        if state is None:
            return self.max_depth
        return self.depths.get(state.state.step_name, self.max_depth)

    def graph(self, kind: str, engine: str, depth: int, search: str | None = None) -> Graph:
        """The call's p-graph, cached per shape (see the module docstring).

        kind "llm": DECODE; "embed": EMBED; "search": one SEARCH that is the whole
        retrieval; "retrieve": EMBED on `engine`, then SEARCH on `search`.
        """
        key = (kind, engine, str(depth), search or "")
        graph = self._graphs.get(key)
        if graph is not None:
            return graph
        b = GraphBuilder(f"workflow.{kind}")
        request = b.input("request")
        if kind == "llm":
            node = b.add(
                PrimitiveKind.DECODE,
                {"kv": request},
                engine=engine,
                config={_DEPTH: depth},
                output_ports=(PortSpec("text", PortType.ANY),),
                name="call",
            )
            b.output(result=Value(node.id, "text"))
        elif kind == "embed":
            node = b.add(PrimitiveKind.EMBED, {"texts": request}, engine=engine, config={_DEPTH: depth}, items=1)
            b.output(result=Value(node.id, "vectors"))
        elif kind == "search":
            b.output(result=b.search(request, request, engine=engine, top_k=1, items=1, **{_DEPTH: depth}))
        elif kind == "retrieve" and search is not None:
            bundles = b.input("bundles")
            node = b.add(PrimitiveKind.EMBED, {"texts": request}, engine=engine, config={_DEPTH: 1}, items=1)
            vectors = Value(node.id, "vectors")
            b.output(result=b.search(vectors, bundles, engine=search, top_k=1, items=1, **{_DEPTH: depth}))
        else:
            raise ValueError(f"unknown call shape {kind!r} (search engine: {search!r})")
        graph = self._graphs[key] = b.build(chain_modules=False)
        return graph

    async def call(self, graph: Graph, inputs: dict[str, Any]) -> Any:
        """Run one call's graph; the caller gets the wrapped object's own exception."""
        qid = f"{self.run_key.get() or 'call'}/{next(self._ids)}"
        if self.runtimes is None:
            raise RuntimeError("a workflow call was made before the drop-in placed its engines")
        try:
            out = await self.runtimes.current().run(graph, inputs, query_id=qid, arrival=self.run_started.get())
        except PrimitiveError as exc:
            error = unwrap_error(exc, {})
        else:
            return out["result"]
        raise error
