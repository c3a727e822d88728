"""Trace a LangChain runnable into a Teola p-graph, structurally, without running it.

The graph has two inputs — "input" (the chain's input) and "context" (the query's
`QueryContext`, see `context.py`) — and one output, "output". What each step becomes:

- `RunnableSequence`: its steps in order, wired by data.
- `RunnableParallel`, dict literal: its branches on the same input; the dict's fields
  stay separate values (`values.py`) until a step needs the whole dict.
- `RunnablePassthrough`: nothing (with `func`: a call running it).
- `.assign` (`RunnableAssign`): the dict check, the mapper's branches, a merge.
- `RunnablePick`, `itemgetter`: the field itself when known, else an inline pick.
- `RunnableLambda` (sync or async): a call running the lambda.
- `RunnableBranch`: a call evaluating the conditions -> CONDITION -> one guarded
  sub-graph per branch -> SELECT aggregate.
- `RunnableEach` / `.map()`: EMBED + SEARCH over the whole list for a retriever; else a
  call that runs the traced body (a nested graph) once per element.
- `RunnableBinding`: the bound step, run with the binding's config; `bind()` kwargs on
  a model stay with the model's LLM step; other kwargs or listeners: one call.
- `ChatPromptTemplate`, `PromptTemplate`: FORMAT, one port per variable (`prompts.py`).
- chat model / LLM [+ recognised parser]: PREFILL + DECODE [+ split unit; an inline
  parse] (`models.py`, `parsers.py`).
- `VectorStoreRetriever` over a proven store: EMBED + SEARCH (`retrievers.py`).
- langchain-classic's `MultiQueryRetriever` over such a retriever: its `llm_chain`
  traced, EMBED + SEARCH over the queries it writes, its `unique_union` (`multi_query.py`).
- `RunnableWithFallbacks`, `RunnableRetry`, `RunnableGenerator`: one call running it,
  by design, so their semantics are exactly LangChain's.
- anything else: one call running it, and a one-time warning naming the step.

Recognition is by class (exact class for composition primitives, whose subclasses may
change behaviour); dict keys are never interpreted. Every user step runs through the
original object, so tracing never changes what a step computes.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from langchain_core.output_parsers import BaseOutputParser
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import (
    Runnable,
    RunnableBranch,
    RunnableConfig,
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

from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import MergeMode, PortSpec, PrimitiveKind
from teola_core.ir.types import PortType
from teola_langchain import multi_query
from teola_langchain import steps as fns
from teola_langchain.classes import class_of
from teola_langchain.context import BoundConfigs
from teola_langchain.engines import EngineRegistry
from teola_langchain.models import is_binding, language_model
from teola_langchain.parsers import ParserItems, is_recognised, parse_output, returns_list
from teola_langchain.prompts import describe, is_prompt, render_whole, sole_variable, split_input
from teola_langchain.retrievers import Decomposition, decompose
from teola_langchain.values import MISSING, DictValue, Ref, Sym

# An LLM's max_tokens when the model does not say: an estimate for scheduling only.
DEFAULT_MAX_TOKENS = 256

_BY_DESIGN = (RunnableRetry, RunnableWithFallbacks, RunnableGenerator)


class OpaqueStepWarning(UserWarning):
    """A step Teola does not trace runs as one opaque call: same results, no optimization."""


@dataclass
class SubGraph:
    """One traced graph: `pgraph` as traced, `graph` what runs (the e-graph after passes)."""

    name: str
    pgraph: Graph
    graph: Graph
    passes: list[str] = field(default_factory=list)


@dataclass
class TracedChain:
    """The result of tracing: the main graph, nested graphs (map bodies), what stayed opaque."""

    main: SubGraph
    subgraphs: list[SubGraph]
    opaque: list[str]

    def graphs(self) -> list[SubGraph]:
        return [self.main, *self.subgraphs]


class TraceSession:
    """State shared by the graphs of one trace: engines, nested graphs, opaque-step notes."""

    def __init__(self, engines: EngineRegistry, *, warn: bool = True, expected_items: int | None = None) -> None:
        self.engines = engines
        self.expected_items = expected_items
        self.subgraphs: list[SubGraph] = []
        self.opaque: list[str] = []
        self._warn = warn
        self._noted: set[int] = set()

    def trace(self, runnable: Runnable[Any, Any] | Any, name: str | None = None) -> TracedChain:
        runnable = coerce_to_runnable(runnable)
        start = len(self.subgraphs)
        graph = GraphTracer(name or runnable.get_name(), self).trace(runnable)
        return TracedChain(SubGraph(graph.name, graph, graph), self.subgraphs[start:], list(self.opaque))

    def subgraph(self, name: str, body: Runnable[Any, Any], bound: BoundConfigs) -> SubGraph:
        graph = GraphTracer(name, self).trace(body, bound)
        sub = SubGraph(name, graph, graph)
        self.subgraphs.append(sub)
        return sub

    @contextmanager
    def planning(self, expected_items: int | None) -> Iterator[None]:
        """Plan list LLMs for `expected_items` inside the block, unless the user set a hint."""
        before = self.expected_items
        if before is None:
            self.expected_items = expected_items
        try:
            yield
        finally:
            self.expected_items = before

    def note_opaque(self, step: Runnable[Any, Any], reason: str | None) -> None:
        if id(step) in self._noted:
            return
        self._noted.add(id(step))
        label = f"{step.get_name()} ({type(step).__name__})"
        if reason is None:
            self.opaque.append(f"{label}: runs as one call by design (its semantics are LangChain's)")
            return
        self.opaque.append(f"{label}: {reason}")
        if self._warn:
            warnings.warn(
                f"teola: step {label} runs as one opaque call ({reason}); its results are unchanged, "
                "only its optimization is lost",
                OpaqueStepWarning,
                stacklevel=4,
            )


def trace(
    runnable: Runnable[Any, Any] | Any,
    engines: EngineRegistry,
    *,
    warn: bool = True,
    expected_items: int | None = None,
) -> TracedChain:
    """Trace `runnable` into a p-graph whose engines are registered in `engines`.

    expected_items: how many items an LLM with a list parser is expected to write (a
    planning hint for decode pipelining; results never depend on it).
    """
    return TraceSession(engines, warn=warn, expected_items=expected_items).trace(runnable)


def _inner(bound: BoundConfigs) -> BoundConfigs:
    """Configs handed to a composite's children: run_name and run_id name only its own run."""
    return tuple(
        RunnableConfig(**{k: v for k, v in c.items() if k not in ("run_name", "run_id")})  # type: ignore[typeddict-item]
        for c in bound
    )


def _node_name(name: str, label: str | None) -> str:
    """Node ids read `<step>.<what>`: `format_docs.lambda`, `ChatPromptTemplate.format`."""
    return f"{label}.{name}" if label else name


class GraphTracer:
    """Builds one graph: walks the runnable, threading symbolic values (`values.py`)."""

    def __init__(self, name: str, session: TraceSession) -> None:
        self.session = session
        self.name = name
        self.b = GraphBuilder(name)
        self.input = self.b.input("input")
        self.ctx = self.b.input("context")
        self._memo: list[dict[int, tuple[DictValue, Value]]] = [{}]

    def trace(self, runnable: Runnable[Any, Any], bound: BoundConfigs = ()) -> Graph:
        result = self.step(runnable, Ref(self.input), bound)
        self.b.output(output=self.value(result))
        return self.b.build(chain_modules=False)

    # -- values ----------------------------------------------------------------------
    def value(self, sym: Sym) -> Value:
        """The whole value on one port (a traced dict is built by one inline node)."""
        if isinstance(sym, Ref):
            return sym.value
        for scope in reversed(self._memo):
            if id(sym) in scope:
                return scope[id(sym)][1]
        keys = list(sym.fields)
        parts = {f"p{i}": self.value(s) for i, s in enumerate(sym.fields.values())}
        if sym.base is None:
            value = self._inline(fns.combine(keys), parts, "dict")
        else:
            value = self._inline(fns.merge(keys), {"base": sym.base, **parts}, "assign.merge")
        self._memo[-1][id(sym)] = (sym, value)
        return value

    def items(self, sym: Sym) -> Value:
        """The value as a list a map consumes (item by item when an LLM produces it)."""
        if isinstance(sym, Ref) and sym.items is not None:
            return sym.items
        return self.value(sym)

    @contextmanager
    def _scope(self) -> Iterator[None]:
        """Values built inside a branch are guarded: do not reuse them outside it."""
        self._memo.append({})
        try:
            yield
        finally:
            self._memo.pop()

    def _inline(self, fn: Any, inputs: dict[str, Value], name: str, label: str | None = None) -> Value:
        return self.b.call(fn, inputs, name=_node_name(name, label), label=label, inline=True)

    def _user(self, fn: Any, value: Value, name: str, label: str) -> Value:
        return self.b.call(fn, {"value": value, "ctx": self.ctx}, name=_node_name(name, label), label=label)

    def _const(self, value: Any, name: str = "const") -> Value:
        return self._inline(fns.constant(value), {}, name)

    # -- dispatch --------------------------------------------------------------------
    def step(self, r: Runnable[Any, Any], sym: Sym, bound: BoundConfigs) -> Sym:
        if isinstance(r, _BY_DESIGN):
            return self.opaque(r, sym, bound, None)
        kind = class_of(r)
        if is_binding(r):
            return self.binding(r, sym, bound)
        if kind is RunnableSequence:
            return self.sequence(r.steps, sym, bound)
        if kind is RunnableParallel:
            inner = _inner(bound)
            return DictValue({key: self.step(s, sym, inner) for key, s in r.steps__.items()})
        if kind is RunnableAssign:
            return self.assign(r, sym, bound)
        if kind is RunnablePick:
            return self.pick(r, sym)
        if kind is RunnablePassthrough:
            if r.func is None and r.afunc is None:
                return sym
            return Ref(self._user(fns.run_step(r, bound), self.value(sym), "passthrough", r.get_name()))
        if kind is RunnableLambda:
            return self.lambda_(r, sym, bound)
        if kind is RunnableBranch:
            return self.branch(r, sym, bound)
        if kind is RunnableEach:
            return self.each(r, sym, bound)
        if is_prompt(r):
            return self.prompt(r, sym)
        if language_model(r) is not None:
            return self.llm(r, sym, bound, None)
        if is_recognised(r):
            fn = fns.apply(partial(parse_output, r))
            return Ref(self._inline(fn, {"value": self.value(sym)}, "parse", r.get_name()))
        if isinstance(r, BaseRetriever):
            return self.retriever(r, sym, bound)
        if isinstance(r, BaseOutputParser):
            return self.opaque(r, sym, bound, f"{type(r).__name__} is not a recognised output parser")
        return self.opaque(r, sym, bound, f"Teola does not trace {type(r).__name__}")

    def opaque(self, r: Runnable[Any, Any], sym: Sym, bound: BoundConfigs, reason: str | None) -> Sym:
        self.session.note_opaque(r, reason)
        return Ref(self._user(fns.run_step(r, bound), self.value(sym), "call", r.get_name()))

    # -- composition -----------------------------------------------------------------
    def binding(self, r: Any, sym: Sym, bound: BoundConfigs) -> Sym:
        if r.config_factories:
            return self.opaque(r, sym, bound, "a binding with config factories (listeners)")
        if language_model(r) is not None:
            return self.llm(r, sym, bound, None)
        if r.kwargs:
            return self.opaque(r, sym, bound, f"bind() arguments on {type(r.bound).__name__}")
        return self.step(r.bound, sym, (r.config, *bound))

    def sequence(self, steps: Sequence[Runnable[Any, Any]], sym: Sym, bound: BoundConfigs) -> Sym:
        inner = _inner(bound)
        steps = list(steps)
        i = 0
        while i < len(steps):
            step = steps[i]
            if language_model(step) is None:
                sym = self.step(step, sym, inner)
                i += 1
                continue
            parser = steps[i + 1] if i + 1 < len(steps) and is_recognised(steps[i + 1]) else None
            mapped = parser is not None and i + 2 < len(steps) and class_of(steps[i + 2]) is RunnableEach
            sym = self.llm(step, sym, inner, parser, items=mapped)
            i += 2 if parser is not None else 1
        return sym

    def assign(self, r: RunnableAssign, sym: Sym, bound: BoundConfigs) -> Sym:
        inner = _inner(bound)
        label = r.get_name()
        checked: Sym = (
            sym
            if isinstance(sym, DictValue)
            else Ref(self._inline(fns.require_dict, {"value": self.value(sym)}, "assign.check", label))
        )
        mapped = self.step(r.mapper, checked, inner)
        if isinstance(mapped, DictValue) and mapped.base is None:
            if isinstance(checked, DictValue):
                return DictValue({**checked.fields, **mapped.fields}, checked.base)
            return DictValue(dict(mapped.fields), base=checked.value)
        merged = self._inline(
            fns.merge_values, {"base": self.value(checked), "update": self.value(mapped)}, "assign.merge", label
        )
        return Ref(merged)

    def pick(self, r: RunnablePick, sym: Sym) -> Sym:
        label = r.get_name()
        if not isinstance(r.keys, str):
            return Ref(self._inline(fns.pick_many(r.keys), {"value": self.value(sym)}, "pick", label))
        if isinstance(sym, DictValue):
            if r.keys in sym.fields:
                return sym.fields[r.keys]
            if sym.base is None:
                return Ref(self._const(None))
            return Ref(self._inline(fns.pick_one(r.keys), {"value": sym.base}, "pick", label))
        return Ref(self._inline(fns.pick_one(r.keys), {"value": self.value(sym)}, "pick", label))

    def lambda_(self, r: RunnableLambda[Any, Any], sym: Sym, bound: BoundConfigs) -> Sym:
        func = getattr(r, "func", None)
        if isinstance(func, operator.itemgetter) and not hasattr(r, "afunc"):
            keys = func.__reduce__()[1]
            label = f"itemgetter({', '.join(map(repr, keys))})"
            if len(keys) == 1 and isinstance(keys[0], str) and isinstance(sym, DictValue):
                if keys[0] in sym.fields:
                    return sym.fields[keys[0]]
                if sym.base is not None:
                    return Ref(self._inline(fns.apply(func), {"value": sym.base}, "get", label))
            return Ref(self._inline(fns.apply(func), {"value": self.value(sym)}, "get", label))
        return Ref(self._user(fns.run_step(r, bound), self.value(sym), "lambda", r.get_name()))

    def branch(self, r: RunnableBranch[Any, Any], sym: Sym, bound: BoundConfigs) -> Sym:
        inner = _inner(bound)
        label = r.get_name()
        conditions = [condition for condition, _ in r.branches]
        bodies = [body for _, body in r.branches] + [r.default]
        index = self._user(fns.choose_branch(conditions, inner), self.value(sym), "branch.choose", label)
        node = self.b.add(
            PrimitiveKind.CONDITION,
            {"value": index},
            config={"predicate": fns.branch_index, "branches": len(bodies), "inline": True},
            name=_node_name("condition", label),
            label=label,
        )
        condition = Value(node.id, "branch")
        parts = []
        for i, body in enumerate(bodies):
            with self.b.branch(condition, i), self._scope():
                out = self.step(body, sym, inner)
                parts.append(self._inline(fns.identity, {"value": self.value(out)}, f"branch.{i}", label))
        return Ref(self.b.aggregate(parts, MergeMode.SELECT))

    def each(self, r: RunnableEach[Any, Any], sym: Sym, bound: BoundConfigs) -> Sym:
        inner = _inner(bound)
        body = r.bound
        label = r.get_name()
        plan = decompose(body) if isinstance(body, BaseRetriever) else None
        if isinstance(plan, Decomposition):
            return Ref(self._retrieve(plan, self.items(sym), None, body.get_name()))
        sub = self.session.subgraph(f"{self.name}/{label}", body, inner)
        return Ref(self._user(fns.run_map(sub, inner), self.items(sym), "map", label))

    # -- components ------------------------------------------------------------------
    def prompt(self, p: Any, sym: Sym) -> Sym:
        template = describe(p)
        label = p.get_name()
        if not template.ports:
            return Ref(self._inline(render_whole(p), {"value": self.value(sym)}, "format", label))
        if isinstance(sym, DictValue):
            ports = {var: self._field_or_missing(sym, var, label) for var in template.ports}
        else:
            split = self.b.call(
                split_input(template.ports, sole_variable(p)),
                {"value": self.value(sym)},
                outputs=template.ports,
                name=_node_name("inputs", label),
                label=label,
                inline=True,
            )
            ports = {var: Value(split.node, var) for var in template.ports}
        node = self.b.add(
            PrimitiveKind.FORMAT,
            ports,
            config={"template": template},
            input_ports=tuple(PortSpec(v, PortType.ANY) for v in template.ports),
            name=_node_name("format", label),
            label=label,
        )
        return Ref(Value(node.id, "prompt"))

    def _field_or_missing(self, sym: DictValue, key: str, label: str) -> Value:
        if key in sym.fields:
            return self.value(sym.fields[key])
        if sym.base is None:
            return self._const(MISSING, "missing")
        return self._inline(fns.get_or_missing(key), {"value": sym.base}, "field", label)

    def llm(
        self,
        r: Runnable[Any, Any],
        sym: Sym,
        bound: BoundConfigs,
        parser: BaseOutputParser[Any] | None,
        *,
        items: bool = False,
    ) -> Sym:
        model = language_model(r)
        assert model is not None
        engine = self.session.engines.llm(model)
        lists = parser is not None and returns_list(parser)
        unit = ParserItems(parser) if parser is not None and (lists or items) else None
        max_tokens = getattr(model, "max_tokens", None)
        with self.b.module(r.get_name()):
            out = self.b.llm(
                self.value(sym),
                engine=engine,
                max_tokens=max_tokens if isinstance(max_tokens, int) else DEFAULT_MAX_TOKENS,
                split_unit=unit,
                expected_items=self.session.expected_items if unit is not None else None,
                runnable=r,
                bound_config=bound,
            )
        if parser is None:
            return Ref(out.text)
        if lists:
            assert out.items is not None
            return Ref(out.items, items=out.items)
        parsed = self._inline(fns.apply(partial(parse_output, parser)), {"value": out.text}, "parse", parser.get_name())
        return Ref(parsed, items=out.items)

    def retriever(self, r: BaseRetriever, sym: Sym, bound: BoundConfigs) -> Sym:
        if multi_query.is_multi_query(r):
            return self.multi_query(r, sym, bound)
        plan = decompose(r)
        if isinstance(plan, str):
            return self.opaque(r, sym, bound, plan)
        label = r.get_name()
        query = self._inline(fns.as_list, {"value": self.value(sym)}, "query", label)
        hits = self._retrieve(plan, query, 1, label)
        return Ref(self._inline(fns.unwrap_single, {"value": hits}, "docs", label))

    def multi_query(self, r: Any, sym: Sym, bound: BoundConfigs) -> Sym:
        reason = multi_query.why_opaque(r)
        if reason is not None:
            return self.opaque(r, sym, bound, reason)
        plan = decompose(r.retriever)
        if isinstance(plan, str):
            return self.opaque(r, sym, bound, f"inner retriever: {plan}")
        label, inner_label = r.get_name(), r.retriever.get_name()
        question = self.value(sym)
        with self.session.planning(multi_query.planned_queries(r)):
            generated = self.step(r.llm_chain, DictValue({"question": Ref(question)}), _inner(bound))
        lines = self._inline(multi_query.log_queries(r), {"lines": self.value(generated)}, "log", label)
        inputs = {"lines": lines, "generated": self._retrieve(plan, self.items(generated), None, inner_label)}
        if r.include_original:
            query = self._inline(fns.as_list, {"value": question}, "query", label)
            inputs["original"] = self._retrieve(plan, query, 1, inner_label)
            inputs["question"] = question
        return Ref(self._inline(multi_query.unique_union(r), inputs, "unique_union", label))

    def _retrieve(self, plan: Decomposition, texts: Value, items: int | None, label: str) -> Value:
        embedder = self.session.engines.embeddings(plan.embeddings)
        store = self.session.engines.vectorstore(plan.store)
        index = self._const(plan.store, "index")
        with self.b.module(label):
            vectors = self.b.embed(texts, engine=embedder, items=items)
            return self.b.search(
                vectors, index, engine=store, top_k=plan.top_k, items=items, search_kwargs=plan.search_kwargs
            )
