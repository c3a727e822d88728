"""Trace a LangChain runnable into a Teola p-graph, structurally, without running it.

The graph has two inputs — "input" (the chain's input) and "context" (the query's
`QueryContext`) — and one output, "output". Every step keeps LangChain's semantics:

- composites Teola executes itself — `RunnableSequence`, `RunnableParallel` (and dict
  literals), `.assign`, `RunnableBranch`, `.map()` (`RunnableEach`), `RunnableBinding` —
  become an `open` node (their callback run starts, as their code starts it), their
  children, and a `close` node (the run ends with the output) (`runs.py`);
- a chat model or LLM (or a binding around one) becomes PREFILL + DECODE on the model's
  engine; the decode calls the model's own `invoke`/`ainvoke` with the step's config;
- a `VectorStoreRetriever` over a proven store becomes EMBED + SEARCH inside the
  retriever's own callback run (`retrievers.py`);
- every other step (prompt, parser, lambda, passthrough, pick, generator, retriever,
  fallbacks, retry, unknown runnables) is a leaf: its own `invoke`/`ainvoke` runs.

A composite is executed by Teola only when it is exactly LangChain's class and its
methods are LangChain's own (`patched`); a subclass, or a class or instance whose
`invoke` was replaced, runs as a leaf, so whatever replaced it is what runs.
Recognition is by class; dict keys are never interpreted.

Where a prompt's variables come from separate steps (a dict built by a parallel), the
tracer records that on the model's PREFILL (`PromptPlan`), so prefill split can warm the
ready start of the prompt while the rest is still computed.

Every node that runs a step of the chain (a leaf, a model's decode, a map, a retriever's
embedding) carries the step's key (`keys.py`) as `config[LATENCY_KEY]`: the passes plan
with the step's observed run time (`teola_core.passes.estimates`). A `model | list
parser | .map(body)` run (optionally with a proven list slice before the map,
`slices.py`) pipelines the model's items into the body when the number of items is known:
`expected_items=`, or learned from the parser's past outputs (`TraceSession.counts`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import count
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

from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import Capabilities, MergeMode, PortSpec, PrimitiveKind
from teola_core.ir.prompt import PromptPlan
from teola_core.ir.types import PortType
from teola_core.passes.estimates import LATENCY_KEY
from teola_langchain import keys, multi_query, steps
from teola_langchain.advice import StepInfo, opaque_advice
from teola_langchain.classes import class_of
from teola_langchain.context import StepRef
from teola_langchain.engines import EngineRegistry
from teola_langchain.models import is_binding, language_model
from teola_langchain.parsers import ParserItems, is_recognised
from teola_langchain.patched import runs_own_code
from teola_langchain.prompts import describe, is_prompt
from teola_langchain.retrievers import Decomposition, decompose
from teola_langchain.slices import SlicedItems, list_slice, sliced_count
from teola_langchain.traced import Blocked, SubGraph, TracedChain
from teola_langchain.values import MISSING

# An LLM's max_tokens when the model does not say: an estimate for scheduling only.
DEFAULT_MAX_TOKENS = 256

# Leaves Teola knows and runs as they are; anything else runs as they are too, with a note.
_KNOWN_LEAVES = (
    RunnableLambda,
    RunnablePassthrough,
    RunnablePick,
    RunnableGenerator,
    RunnableRetry,
    RunnableWithFallbacks,
)


class OpaqueStepWarning(UserWarning):
    """A step Teola does not look into runs as one call: same results, no optimization inside."""


@dataclass(frozen=True)
class Ref:
    """A value on one port, as the chain computes it.

    plan: for a prompt's output, how the prompt is made from separately computed fields
    (so prefill split can warm its ready start; see `teola_core.ir.prompt.PromptPlan`).
    """

    value: Value
    plan: PromptPlan | None = None


@dataclass(frozen=True, eq=False)
class DictValue:
    """A dict a composite builds: the whole value, and where each known field comes from.

    `fields` serve planning only (which prompt variables are ready when); every step
    receives `whole`, the dict the composite returned. `open`: the dict may hold keys
    beyond `fields` (`.assign` on an input whose keys are unknown).
    """

    whole: Value
    fields: dict[str, Value]
    open: bool = False


Sym = Ref | DictValue


class TraceSession:
    """State shared by the graphs of one trace: engines, nested graphs, opaque-step notes."""

    def __init__(
        self,
        engines: EngineRegistry,
        *,
        warn: bool = True,
        expected_items: int | None = None,
        counts: Callable[[str], int | None] | None = None,
    ) -> None:
        self.engines = engines
        self.expected_items = expected_items
        self.counts = counts  # a step key -> how many items it usually outputs (learned)
        self.subgraphs: list[SubGraph] = []
        self.opaque: list[str] = []
        self.steps: dict[str, StepInfo] = {}
        self.blocked: list[Blocked] = []
        self._warn = warn
        self._noted: set[int] = set()

    def trace(self, runnable: Runnable[Any, Any] | Any, name: str | None = None) -> TracedChain:
        runnable = coerce_to_runnable(runnable)
        start = len(self.subgraphs)
        graph = GraphTracer(name or runnable.get_name(), self).trace(runnable, StepRef())
        main = SubGraph(graph.name, graph, graph)
        return TracedChain(main, self.subgraphs[start:], list(self.opaque), dict(self.steps), list(self.blocked))

    def items_of(self, parser_key: str) -> int | None:
        """How many items the model before the parser `parser_key` is expected to write."""
        if self.expected_items is not None:
            return self.expected_items
        return self.counts(parser_key) if self.counts is not None else None

    def subgraph(self, name: str, body: Runnable[Any, Any], ref: StepRef, paths: dict[str | None, str]) -> SubGraph:
        graph = GraphTracer(name, self, paths).trace(body, ref)
        sub = SubGraph(name, graph, graph)
        self.subgraphs.append(sub)
        return sub

    def note_opaque(self, step: Runnable[Any, Any], reason: str) -> None:
        if id(step) in self._noted:
            return
        self._noted.add(id(step))
        label = f"{step.get_name()} ({type(step).__name__})"
        self.opaque.append(f"{label}: {reason}")
        if self._warn:
            warnings.warn(
                f"teola: step {label} runs as one call ({reason}); its results are unchanged, "
                "only optimization inside it is lost",
                OpaqueStepWarning,
                stacklevel=5,
            )


def trace(runnable: Runnable[Any, Any] | Any, engines: EngineRegistry, *, warn: bool = True) -> TracedChain:
    """Trace `runnable` into a p-graph whose engines are registered in `engines`."""
    return TraceSession(engines, warn=warn).trace(runnable)


class GraphTracer:
    """Builds one graph by walking the runnable (see the module docstring)."""

    def __init__(self, name: str, session: TraceSession, paths: dict[str | None, str] | None = None) -> None:
        self.session = session
        self.name = name
        self.b = GraphBuilder(name)
        self.input = self.b.input("input")
        self.ctx = self.b.input("context")
        self._scopes = count()
        self.paths: dict[str | None, str] = {None: keys.CHAIN, **(paths or {})}  # run scope -> its step key

    def trace(self, runnable: Runnable[Any, Any], ref: StepRef) -> Graph:
        result = self.step(runnable, Ref(self.input), ref)
        self.b.output(output=self.whole(result))
        return self.b.build(chain_modules=False)

    @staticmethod
    def whole(sym: Sym) -> Value:
        return sym.value if isinstance(sym, Ref) else sym.whole

    def _user(self, fn: Any, inputs: dict[str, Value], name: str, label: str, key: str | None = None) -> Value:
        ports = {**inputs, "ctx": self.ctx}
        node = self.b.add(
            PrimitiveKind.CALL,
            ports,
            config={"fn": fn, "inline": False, **({LATENCY_KEY: key} if key is not None else {})},
            input_ports=tuple(PortSpec(p, PortType.ANY) for p in ports),
            output_ports=(PortSpec("value", PortType.ANY),),
            name=f"{label}.{name}",
            label=label,
        )
        return Value(node.id, "value")

    def _scope(self, label: str) -> str:
        return f"{label}#{next(self._scopes)}"

    def key(self, r: Runnable[Any, Any], ref: StepRef, kind: str | None = None, opaque: str | None = None) -> str:
        """The step key of `r` at `ref` (`keys.py`); with `kind`, recorded for explain()."""
        if ref.scope is None and ref.tag is None:
            key = keys.CHAIN  # the chain itself (or the whole of it, one step)
        else:
            key = keys.child_key(self.paths[ref.scope], _run_name(r, ref), ref.tag)
        if kind is not None:
            advice = opaque_advice(r, opaque) if opaque is not None else None
            self.session.steps.setdefault(key, StepInfo(kind, type(r).__name__, opaque, advice))
        return key

    # -- dispatch --------------------------------------------------------------------
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

    def barrier_step(self, r: Runnable[Any, Any], sym: Sym, ref: StepRef) -> Sym:
        """A top-level step whose own `batch` a batch() call must run: a model, or one call."""
        if language_model(r) is not None:
            return self.model(r, sym, ref)
        return self.leaf(r, sym, ref, None)

    def leaf(self, r: Runnable[Any, Any], sym: Sym, ref: StepRef, reason: str | None) -> Sym:
        if reason is not None:
            self.session.note_opaque(r, reason)
        label = r.get_name()
        key = self.key(r, ref, "retriever" if isinstance(r, BaseRetriever) else "leaf", reason)
        out = self._user(steps.leaf(r, ref), {"value": self.whole(sym)}, "invoke", label, key)
        return Ref(out, self._prompt_plan(r, sym) if is_prompt(r) else None)

    def _prompt_plan(self, prompt: Any, sym: Sym) -> PromptPlan | None:
        """Where each of the prompt's variables comes from, when its input is a dict built by the chain."""
        if not isinstance(sym, DictValue):
            return None
        template = describe(prompt)
        partials = set(prompt.partial_variables)
        sources = []
        for var in template.ports:
            if var in sym.fields:
                value = sym.fields[var]
            elif var in partials or not sym.open:
                value = self.b.call(steps.constant(MISSING), {}, name="missing", inline=True)
            else:  # the key may come from a dict whose keys are known only at run time
                value = self.b.call(steps.get_or_missing(var), {"value": sym.whole}, name="field", inline=True)
            sources.append((var, value.node, value.port))
        return PromptPlan(template, tuple(sources))

    # -- composites ------------------------------------------------------------------
    def _open(self, r: Runnable[Any, Any], sym: Sym, ref: StepRef) -> tuple[str, Value]:
        scope = self._scope(r.get_name())
        self.paths[scope] = self.key(r, ref)
        opened = self._user(steps.open_run(scope, ref, r.get_name()), {"value": self.whole(sym)}, "open", r.get_name())
        return scope, opened

    def _close(self, r: Runnable[Any, Any], scope: str, value: Value) -> Value:
        return self._user(steps.close_run(scope), {"value": value}, "close", r.get_name())

    def sequence(self, r: RunnableSequence[Any, Any], sym: Sym, ref: StepRef) -> Sym:
        scope, opened = self._open(r, sym, ref)
        current: Sym = _carry(sym, opened)
        root = ref == StepRef()  # the chain itself: batch() calls it stage by stage (`batching.py`)
        chain = list(r.steps)
        i = 0
        while i < len(chain):
            s = chain[i]
            child = StepRef(scope, f"seq:step:{i + 1}")
            if root:
                reached = self.b.call(
                    steps.reach_step(i), {"value": self.whole(current), "ctx": self.ctx}, name="reach", inline=True
                )
                current = _carry(current, reached)
                if not steps.batches_per_item(s):
                    current = self.barrier_step(s, current, replace(child, barrier=i))
                    i += 1
                    continue
            pipeline = self._pipelinable(chain, i, scope)
            if pipeline is not None:
                current = self.pipelined(pipeline, current, scope, i)
                i += 4 if pipeline.trim is not None else 3
                continue
            current = self.step(s, current, child)
            i += 1
        closed = self._close(r, scope, self.whole(current))
        return _carry(current, closed)

    def _pipelinable(self, chain: list[Runnable[Any, Any]], i: int, scope: str) -> _Pipeline | None:
        """Steps i.. are `model | list parser | [proven slice] | .map(body)` and the number of
        items is known (`expected_items=`, or learned): the plan to pipeline them; else None
        (and, where only the count or the shape is missing, a note for explain())."""
        if i + 2 >= len(chain) or language_model(chain[i]) is None:
            return None
        model, parser = chain[i], chain[i + 1]
        keep = list_slice(chain[i + 2]) if i + 3 < len(chain) else None
        trim = chain[i + 2] if keep is not None else None
        each = chain[i + 3] if keep is not None else chain[i + 2]
        if not _is_map(each):
            if i + 3 < len(chain) and _is_map(chain[i + 3]) and is_recognised(parser):
                self._block(
                    chain[i + 2],
                    StepRef(scope, f"seq:step:{i + 3}"),
                    "it stands between the list parser and the .map(), and is not a list slice Teola can prove, "
                    "so the model's items cannot go to the map while it writes",
                    "put the .map() right after the parser, or keep items with a plain `lambda xs: xs[:k]`",
                )
            return None
        parser_ref = StepRef(scope, f"seq:step:{i + 2}")
        if not is_recognised(parser):
            self._block(
                parser,
                parser_ref,
                "a .map() follows it, but Teola cannot read this parser's items as the model writes them",
                "use a list parser Teola streams: teola_langchain.parsers.LineListOutputParser, "
                "NumberedListOutputParser or MarkdownListOutputParser",
            )
            return None
        body = each.bound
        decomposable = isinstance(decompose(body) if isinstance(body, BaseRetriever) else None, Decomposition)
        if not decomposable and not steps.batches_per_item(body):
            return None
        count = self.session.items_of(self.key(parser, parser_ref))
        n = count if keep is None else sliced_count(count, keep)
        if n is None or n < 2:
            why = (
                "the number of items it writes is not known yet (it is learned from the parser's outputs "
                "after a few calls)"
                if n is None
                else f"it writes {count} item(s), {n} of which reach the map: nothing to overlap"
            )
            self._block(
                model,
                StepRef(scope, f"seq:step:{i + 1}"),
                f"decode pipelining into the .map() is not planned: {why}",
                "pass expected_items=N to plan it from the first call" if n is None else "nothing to change",
            )
            return None
        return _Pipeline(model, parser, trim, keep, each, n)

    def _block(self, r: Runnable[Any, Any], ref: StepRef, why: str, advice: str) -> None:
        self.session.blocked.append(Blocked(self.key(r, ref), why, advice))

    def pipelined(self, p: _Pipeline, sym: Sym, scope: str, i: int) -> Sym:
        """model | list parser | [slice] | .map(body): each item goes to the body while the model writes the next.

        The model streams (its own `stream`); the parser (and the slice step) run on its
        whole output, as always; the map's run opens when the model starts and ends with
        the list it was given as its input, as LangChain's streaming records a run whose
        input arrives later. With a slice, the decode's items are the slice of the
        parser's (`SlicedItems`), checked against the slice step's own output at the end.
        """
        unit = ParserItems(p.parser) if p.keep is None else SlicedItems(p.parser, p.keep)
        text, items = self.model(p.model, sym, StepRef(scope, f"seq:step:{i + 1}"), unit=(unit, p.n))
        given = self.leaf(p.parser, Ref(text), StepRef(scope, f"seq:step:{i + 2}"), None)
        if p.trim is not None:
            given = self.leaf(p.trim, given, StepRef(scope, f"seq:step:{i + 3}"), None)
        label = p.each.get_name()
        each_ref = StepRef(scope, f"seq:step:{i + (4 if p.trim is not None else 3)}")
        each_scope = self._scope(label)
        self.paths[each_scope] = self.key(p.each, each_ref, "map")
        opened = self._user(
            steps.open_run(each_scope, each_ref, label, streaming=True),
            {"value": self.whole(sym)},
            "open",
            label,
        )
        element = StepRef(each_scope, None)
        body = p.each.bound
        plan = decompose(body) if isinstance(body, BaseRetriever) else None
        if isinstance(plan, Decomposition):
            out = self._retrieve(body, plan, items, element, after=opened)
        else:
            key = self.key(body, element, "leaf")
            out = self._itemwise(
                steps.invoke_items(body, element), {"items": items, "after": opened}, "map", label, key=key
            )
        inputs = {"value": out, "inputs": self.whole(given)}
        close = steps.close_run(each_scope)
        if p.trim is not None:
            inputs["items"] = items
            close = steps.close_sliced_map(each_scope)
        return Ref(self._user(close, inputs, "close", label))

    def parallel(self, r: RunnableParallel[Any], sym: Sym, ref: StepRef) -> Sym:
        scope, opened = self._open(r, sym, ref)
        given = _carry(sym, opened)
        names = list(r.steps__)
        parts = {key: self.step(s, given, StepRef(scope, f"map:key:{key}")) for key, s in r.steps__.items()}
        inputs = {f"p{i}": self.whole(p) for i, p in enumerate(parts.values())}
        closed = self._user(steps.close_dict(scope, names), inputs, "close", r.get_name())
        return DictValue(closed, {key: self.whole(p) for key, p in parts.items()})

    def assign(self, r: RunnableAssign, sym: Sym, ref: StepRef) -> Sym:
        scope, opened = self._open(r, sym, ref)
        checked = self.b.call(steps.require_dict, {"value": opened}, name=f"{r.get_name()}.check", inline=True)
        mapped = self.step(r.mapper, _carry(sym, checked), StepRef(scope, None))
        merged = self._user(
            steps.close_merge(scope), {"base": checked, "update": self.whole(mapped)}, "close", r.get_name()
        )
        fields = dict(sym.fields) if isinstance(sym, DictValue) else {}
        if isinstance(mapped, DictValue):
            fields.update(mapped.fields)
        known_base = isinstance(sym, DictValue) and not sym.open
        return DictValue(merged, fields, open=not known_base or (isinstance(mapped, DictValue) and mapped.open))

    def branch(self, r: RunnableBranch[Any, Any], sym: Sym, ref: StepRef) -> Sym:
        scope, opened = self._open(r, sym, ref)
        given = _carry(sym, opened)
        conditions = [c for c, _ in r.branches]
        bodies = [b for _, b in r.branches] + [r.default]
        tags = [f"branch:{i + 1}" for i in range(len(r.branches))] + ["branch:default"]
        index = self._user(steps.choose_branch(conditions, scope), {"value": opened}, "choose", r.get_name())
        node = self.b.add(
            PrimitiveKind.CONDITION,
            {"value": index},
            config={"predicate": steps.branch_index, "branches": len(bodies)},
            name=f"{r.get_name()}.condition",
            label=r.get_name(),
        )
        condition = Value(node.id, "branch")
        parts = []
        for i, (body, tag) in enumerate(zip(bodies, tags, strict=True)):
            with self.b.branch(condition, i):
                out = self.step(body, given, StepRef(scope, tag))
                parts.append(self.b.call(steps.identity, {"value": self.whole(out)}, name=f"branch.{i}", inline=True))
        chosen = self.b.aggregate(parts, MergeMode.SELECT)
        return Ref(self._close(r, scope, chosen))

    def each(self, r: RunnableEach[Any, Any], sym: Sym, ref: StepRef) -> Sym:
        body = r.bound
        plan = decompose(body) if isinstance(body, BaseRetriever) else None
        if not isinstance(plan, Decomposition) and not steps.batches_per_item(body):
            return self.leaf(r, sym, ref, f"its body {type(body).__name__} has its own batch()")
        scope, opened = self._open(r, sym, ref)
        element = StepRef(scope, None)
        if isinstance(plan, Decomposition):
            out = self._retrieve(body, plan, opened, element, after=opened)
        else:
            sub = self.session.subgraph(f"{self.name}/{r.get_name()}", body, element, self.paths)
            key = self.key(r, ref, "map")
            out = self._user(steps.run_map(sub), {"value": opened}, "map", r.get_name(), key)
        return Ref(self._close(r, scope, out))

    # -- components ------------------------------------------------------------------
    def model(self, r: Runnable[Any, Any], sym: Sym, ref: StepRef, unit: tuple[Any, int] | None = None) -> Any:
        """PREFILL + DECODE on the model's engine; with `unit` (split unit, expected items)
        the decode also yields its parsed items, for decode pipelining, and this returns
        (text, items) values instead of a `Ref`."""
        model = language_model(r)
        assert model is not None
        engine = self.session.engines.llm(model)
        max_tokens = getattr(model, "max_tokens", None)
        config: dict[str, Any] = {"step": steps.ModelStep(r, ref)}
        key = self.key(r, ref, "model")
        if isinstance(sym, Ref) and sym.plan is not None:
            config["prompt_plan"] = sym.plan
        label = r.get_name()
        prefill = self.b.add(
            PrimitiveKind.PREFILL,
            {"prompt": self.whole(sym)},
            engine=engine,
            name=f"{label}.prefill",
            label=label,
            config=config,
        )
        outputs = [PortSpec("text", PortType.TEXT)]
        caps = None
        decode_config = {
            **config,
            "max_tokens": max_tokens if isinstance(max_tokens, int) else DEFAULT_MAX_TOKENS,
            LATENCY_KEY: key,
        }
        if unit is not None:
            outputs.append(PortSpec("items", PortType.ITEMS))
            caps = Capabilities(True, True, (), "items", MergeMode.CONCAT)
            decode_config.update(split_unit=unit[0], expected_items=unit[1])
        decode = self.b.add(
            PrimitiveKind.DECODE,
            {"kv": Value(prefill.id, "kv")},
            engine=engine,
            name=f"{label}.decode",
            label=label,
            config=decode_config,
            output_ports=tuple(outputs),
            items=None if unit is None else unit[1],
            caps=caps,
        )
        if unit is not None:
            return Value(decode.id, "text"), Value(decode.id, "items")
        return Ref(Value(decode.id, "text"))

    def retriever(self, r: BaseRetriever, sym: Sym, ref: StepRef) -> Sym:
        if multi_query.is_multi_query(r):
            return self.multi_query(r, sym, ref)
        plan = decompose(r)
        if isinstance(plan, str):
            return self.leaf(r, sym, ref, plan)
        query = self.b.call(steps.as_list, {"value": self.whole(sym)}, name=f"{r.get_name()}.query", inline=True)
        docs = self._retrieve(r, plan, query, ref, after=self.whole(sym))
        return Ref(self.b.call(steps.only, {"value": docs}, name=f"{r.get_name()}.docs", inline=True))

    def multi_query(self, r: Any, sym: Sym, ref: StepRef) -> Sym:
        """langchain-classic's `MultiQueryRetriever`, its own calls in its own run (`multi_query.py`).

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

    def _retrieve(self, r: BaseRetriever, plan: Decomposition, queries: Value, ref: StepRef, *, after: Value) -> Value:
        """EMBED + SEARCH of each query inside its own retriever run; item-wise, so it can pipeline."""
        label = r.get_name()
        key = self.key(r, ref, "retriever")
        embedder = self.session.engines.embeddings(plan.embeddings)
        store = self.session.engines.vectorstore(plan.store)
        started = self._itemwise(steps.start_retrievals(r, ref), {"items": queries, "after": after}, "start", label)
        texts = self._itemwise(steps.queries_of, {"items": started}, "queries", label, inline=True)
        index = self.b.call(steps.constant(plan.store), {}, name=f"{label}.index", inline=True)
        with self.b.module(label):
            vectors = self.b.embed(texts, engine=embedder, **{LATENCY_KEY: key})  # charged the retriever's run

            hits = self.b.search(vectors, index, engine=store, top_k=plan.top_k, search_kwargs=plan.search_kwargs)
        return self._itemwise(steps.end_retrievals, {"items": started, "hits": hits}, "end", label)

    def _itemwise(
        self, fn: Any, inputs: dict[str, Value], name: str, label: str, inline: bool = False, key: str | None = None
    ) -> Value:
        """A call on item-aligned lists ("items", "hits"): replicated per part when its input is split."""
        ports = {**inputs} if inline else {**inputs, "ctx": self.ctx}
        item_ports = tuple(p for p in ports if p in ("items", "hits"))
        node = self.b.add(
            PrimitiveKind.CALL,
            ports,
            config={"fn": fn, "inline": inline, **({LATENCY_KEY: key} if key is not None else {})},
            input_ports=tuple(PortSpec(p, PortType.ANY) for p in ports),
            output_ports=(PortSpec("value", PortType.ANY),),
            name=f"{label}.{name}",
            label=label,
            caps=Capabilities(True, True, item_ports, "value", MergeMode.CONCAT),
        )
        return Value(node.id, "value")


@dataclass(frozen=True)
class _Pipeline:
    """`model | parser | [trim] | each`, pipelined for `n` items (`keep`: the slice `trim` takes)."""

    model: Any
    parser: Any
    trim: Any
    keep: slice | None
    each: Any
    n: int


def _is_map(step: Any) -> bool:
    return class_of(step) is RunnableEach and runs_own_code(step, RunnableEach)


def _run_name(r: Runnable[Any, Any], ref: StepRef) -> str:
    """The name of the step's callback run: the outermost binding's `run_name`, else its own name."""
    configs = [r.config, *ref.bound] if is_binding(r) else list(ref.bound)
    name = None
    for config in configs:  # innermost first: an outer binding's config overrides an inner one's
        name = config.get("run_name") or name
    return name or r.get_name()


def _carry(sym: Sym, value: Value) -> Sym:
    """`sym` as handed on through `value` (an open/close node): same fields, new whole."""
    if isinstance(sym, DictValue):
        return DictValue(value, sym.fields, sym.open)
    return Ref(value, sym.plan)


def _is_parser(r: Runnable[Any, Any]) -> bool:
    from langchain_core.output_parsers import BaseOutputParser

    return isinstance(r, BaseOutputParser)
