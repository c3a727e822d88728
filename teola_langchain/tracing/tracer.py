"""Trace a LangChain runnable into a Teola p-graph, structurally, without running it.

    traced = trace(chain, EngineRegistry())   # a `TracedChain`: graphs, notes for explain()

The graph has two inputs — "input" (the chain's input) and "context" (the query's
`QueryContext`) — and one output, "output". Every step keeps LangChain's semantics;
`GraphTracer.step` sends each to the nodes of its kind:

- composites Teola executes itself — `RunnableSequence`, `RunnableParallel` (and dict
  literals), `.assign`, `RunnableBranch`, `.map()` (`RunnableEach`), `RunnableBinding` —
  become an `open` node, their children, and a `close` node (`composites.py`);
- a chat model or LLM (or a binding around one) becomes PREFILL + DECODE on the model's
  engine (`step_nodes.py`);
- a `VectorStoreRetriever` over a proven store becomes EMBED + SEARCH inside the
  retriever's own callback run (`components/retrievers.py`), langchain-classic's
  `MultiQueryRetriever` its own calls in its own run (`components/multi_query.py`), and
  its `ContextualCompressionRetriever` with a `CrossEncoderReranker` EMBED + SEARCH +
  RERANK in its own run (`components/compression.py`);
- every other step (prompt, parser, lambda, passthrough, pick, generator, retriever,
  fallbacks, retry, unknown runnables) is a leaf: its own `invoke`/`ainvoke` runs.

A composite is executed by Teola only when it is exactly LangChain's class and its
methods are LangChain's own (`patched`); a subclass, or a class or instance whose
`invoke` was replaced, runs as a leaf, so whatever replaced it is what runs.
Recognition is by class; dict keys are never interpreted.

Every node that runs a step of the chain (a leaf, a model's decode, a map, a retriever's
embedding) carries the step's key (`keys.py`) as `config[LATENCY_KEY]`: the passes plan
with the step's observed run time (`teola_core.passes.estimates`). A `model | list
parser | .map(body)` run is pipelined when the number of items is known (`pipelining.py`).
"""

from __future__ import annotations

from typing import Any

from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import (
    Runnable,
    RunnableBinding,
    RunnableBranch,
    RunnableGenerator,
    RunnableLambda,
    RunnableParallel,
    RunnablePassthrough,
    RunnableSequence,
    RunnableWithFallbacks,
)
from langchain_core.runnables.base import RunnableEach, coerce_to_runnable
from langchain_core.runnables.passthrough import RunnableAssign, RunnablePick
from langchain_core.runnables.retry import RunnableRetry

from teola_core.ir.builder import Value
from teola_core.ir.kinds import Capabilities, PortSpec, PrimitiveKind
from teola_core.ir.types import PortType
from teola_langchain.components import compression, multi_query
from teola_langchain.components.classes import class_of
from teola_langchain.components.models import is_binding, language_model
from teola_langchain.components.parsers import ParserItems
from teola_langchain.components.patched import runs_own_code
from teola_langchain.components.prompts import is_prompt
from teola_langchain.components.retrievers import Decomposition, decompose
from teola_langchain.engines import EngineRegistry
from teola_langchain.execution import steps
from teola_langchain.execution.context import StepRef
from teola_langchain.tracing.composites import Composites
from teola_langchain.tracing.session import TraceSession
from teola_langchain.tracing.traced import SubGraph, TracedChain
from teola_langchain.tracing.values import Ref, Sym

# Leaves Teola knows and runs as they are; anything else runs as they are too, with a note.
_KNOWN_LEAVES = (
    RunnableLambda,
    RunnablePassthrough,
    RunnablePick,
    RunnableGenerator,
    RunnableRetry,
    RunnableWithFallbacks,
)


def trace(runnable: Runnable[Any, Any] | Any, engines: EngineRegistry, *, warn: bool = True) -> TracedChain:
    """Trace `runnable` into a p-graph whose engines are registered in `engines`."""
    return trace_in(TraceSession(engines, warn=warn), runnable)


def trace_in(session: TraceSession, runnable: Runnable[Any, Any] | Any, name: str | None = None) -> TracedChain:
    """Trace `runnable` in `session`: its main graph, and the graphs nested in it since."""
    runnable = coerce_to_runnable(runnable)
    start = len(session.subgraphs)
    graph = GraphTracer(name or runnable.get_name(), session).trace(runnable, StepRef())
    main = SubGraph(graph.name, graph, graph)
    subgraphs = session.subgraphs[start:]
    return TracedChain(
        main, subgraphs, list(session.opaque), dict(session.steps), list(session.blocked), list(session.early)
    )


class GraphTracer(Composites):
    """Builds one graph by walking the runnable (see the module docstring)."""

    def step(self, r: Runnable[Any, Any], sym: Sym, ref: StepRef) -> Sym:
        kind = class_of(r)
        if language_model(r) is not None:
            return self.model(r, sym, ref)
        if is_binding(r) and runs_own_code(r, RunnableBinding):
            if r.config_factories or r.kwargs:
                return self.leaf(r, sym, ref, None)
            return self.step(r.bound, sym, ref.within((r.config,)))
        if kind is RunnableSequence and runs_own_code(r, RunnableSequence):
            return self.sequence(r, sym, ref)
        if kind is RunnableParallel and runs_own_code(r, RunnableParallel):
            return self.parallel(r, sym, ref)
        if kind is RunnableAssign and runs_own_code(r, RunnableAssign):
            return self.assign(r, sym, ref)
        if kind is RunnableBranch and runs_own_code(r, RunnableBranch):
            return self.branch(r, sym, ref)
        if kind is RunnableEach and runs_own_code(r, RunnableEach):
            return self.each(r, sym, ref)
        if isinstance(r, BaseRetriever):
            return self.retriever(r, sym, ref)
        if isinstance(r, _KNOWN_LEAVES) or is_prompt(r) or _is_parser(r):
            return self.leaf(r, sym, ref, None)
        return self.leaf(r, sym, ref, f"Teola does not look into {type(r).__name__}")

    def retriever(self, r: BaseRetriever, sym: Sym, ref: StepRef) -> Sym:
        if multi_query.is_multi_query(r):
            return self.multi_query(r, sym, ref)
        if compression.is_compression(r):
            return self.compression(r, sym, ref)
        plan = decompose(r)
        if isinstance(plan, str):
            return self.leaf(r, sym, ref, plan)
        query = self.b.call(steps.as_list, {"value": self.whole(sym)}, name=f"{r.get_name()}.query", inline=True)
        docs = self._retrieve(r, plan, query, ref, after=self.whole(sym))
        return Ref(self.b.call(steps.only, {"value": docs}, name=f"{r.get_name()}.docs", inline=True))

    def multi_query(self, r: Any, sym: Sym, ref: StepRef) -> Sym:
        """langchain-classic's `MultiQueryRetriever`, its own calls in its own run (`components/multi_query.py`).

        Its `llm_chain` runs under the retriever's run; the queries the model writes go to
        the inner retriever one by one while it writes the next (decode pipelining), and
        the retriever's own `unique_union` ends it.
        """
        reason = multi_query.why_opaque(r)
        plan = decompose(r.retriever)
        if reason is None and isinstance(plan, str):
            reason = f"inner retriever: {plan}"
        if reason is not None or not isinstance(plan, Decomposition):
            return self.leaf(r, sym, ref, reason)
        label = r.get_name()
        scope = self._scope(label)
        self.paths[scope] = self.key(r, ref, "retriever")
        question = self._user(steps.open_retriever(r, scope, ref), {"value": self.whole(sym)}, "open", label)
        inside = StepRef(scope, None)  # the retriever hands its calls `{"callbacks": run_manager.get_child()}`
        chain = r.llm_chain
        asked = self.b.call(steps.as_question, {"value": question}, name=f"{label}.question", inline=True)
        chain_scope, opened = self._open(chain, Ref(asked), inside)
        current: Sym = Ref(opened)
        parts = list(chain.steps)
        for j, s in enumerate(parts[:-2]):
            current = self.step(s, current, StepRef(chain_scope, f"seq:step:{j + 1}"))
        model, parser = parts[-2], parts[-1]
        parser_ref = StepRef(chain_scope, f"seq:step:{len(parts)}")
        n = self.session.items_of(self.key(parser, parser_ref)) or multi_query.planned_queries(r)
        model_ref = StepRef(chain_scope, f"seq:step:{len(parts) - 1}")
        if n is not None and n >= 2:
            text, items = self.model(model, current, model_ref, unit=(ParserItems(parser), n))
            current = Ref(text)
        else:
            current, items = self.model(model, current, model_ref), None
        parsed = self.leaf(parser, current, parser_ref, None)
        lines = self._close(chain, chain_scope, self.whole(parsed))
        logged = self.b.call(multi_query.log_queries(r), {"lines": lines}, name=f"{label}.log", inline=True)
        inputs = {
            "lines": logged,
            "generated": self._retrieve(r.retriever, plan, items or logged, inside, after=question),
        }
        if r.include_original:
            one = self.b.call(steps.as_list, {"value": question}, name=f"{label}.original", inline=True)
            inputs["original"] = self._retrieve(r.retriever, plan, one, inside, after=question)
            inputs["question"] = question
        union = self.b.call(multi_query.unique_union(r), inputs, name=f"{label}.unique_union", inline=True)
        return Ref(self._close(r, scope, union))

    def compression(self, r: Any, sym: Sym, ref: StepRef) -> Sym:
        """langchain-classic's `ContextualCompressionRetriever` with a `CrossEncoderReranker`, its own
        calls in its own run (`components/compression.py`).

        Its base retriever's run (EMBED + SEARCH) under the retriever's run, then a RERANK that
        is the compressor's own call for the query, and the run closed with `list(...)` of it.
        """
        plan = compression.decompose_compression(r)
        if isinstance(plan, str):
            return self.leaf(r, sym, ref, plan)
        label = r.get_name()
        scope = self._scope(label)
        self.paths[scope] = self.key(r, ref)
        query = self._user(steps.open_retriever(r, scope, ref), {"value": self.whole(sym)}, "open", label)
        inside = StepRef(scope, None)  # the retriever hands its calls `{"callbacks": run_manager.get_child()}`
        one = self.b.call(steps.as_list, {"value": query}, name=f"{label}.query", inline=True)
        found = self._retrieve(r.base_retriever, plan, one, inside, after=query)
        docs = self.b.call(steps.only, {"value": found}, name=f"{label}.found", inline=True)
        engine = self.session.engines.reranker(r.base_compressor)
        self.key(r, ref, "retriever", runs_as=f"{compression.describe(r)} on {engine}")
        node = self.b.add(
            PrimitiveKind.RERANK,
            {"query": query, "docs": docs},
            engine=engine,
            config={"ref": inside, "top_k": r.base_compressor.top_n},
            input_ports=(PortSpec("query", PortType.ANY), PortSpec("docs", PortType.ANY)),
            output_ports=(PortSpec("docs", PortType.ANY),),
            # One call is one query's whole list (not splittable); calls batch only where proven.
            caps=Capabilities(batchable=compression.scores_per_pair(r.base_compressor)),
            name=f"{label}.rerank",
            label=label,
        )
        compressed = self.b.call(steps.listed, {"value": Value(node.id, "docs")}, name=f"{label}.list", inline=True)
        return Ref(self._close(r, scope, compressed))


def _is_parser(r: Runnable[Any, Any]) -> bool:
    from langchain_core.output_parsers import BaseOutputParser

    return isinstance(r, BaseOutputParser)
