"""Dependency pruning for LangChain sequences: a step starts when the keys it reads are ready.

    chain = (RunnablePassthrough.assign(summary=SUMMARY | llm)     # reads "text"
             | RunnablePassthrough.assign(facts=FACTS | llm)       # reads "text": starts at once
             | BRIEF | llm)                                        # reads summary, facts: waits

In a sequence, a step after a parallel or an `.assign` receives a dict whose fields come
from different steps. When the step provably reads only some keys (`components/reads.py`) and those
are ready before the step ahead of it ends, it starts early, on a dict of just those keys
(the *projection*): an `.assign` runs its mapper so, the merge with the real input waits.
The early run is a nested query on the same runtime (so its engine calls batch with
everything else), and its callbacks are recorded, not delivered (`execution/deferred_callbacks.py`).
When the chain reaches the step — the step ahead ended — the recording is handed to the
real handlers with the real input in place of the projection, and the step's output (or
its error) goes on: the finished runs, their inputs, outputs, errors, tags and nesting
are LangChain's. If a step ahead fails, the recording is dropped; if the early run
failed where the projection was read (a prompt missing a variable names the keys it got),
the step runs again, in order, on its real input.

Not started early: a step that reads its whole input (a lambda, a passthrough, a model);
one whose parts have callbacks of their own or print (those would see the early run at
once), or hold a model that answers in call order (LangChain's list-fed fakes); one with
nothing to overlap. `explain()` lists each step's reason (`TraceSession.early`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from langchain_core.language_models import BaseLanguageModel
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableBinding, RunnableBranch, RunnableParallel, RunnableSequence
from langchain_core.runnables.base import RunnableEach
from langchain_core.runnables.fallbacks import RunnableWithFallbacks
from langchain_core.runnables.passthrough import RunnableAssign

from teola_core.ir.builder import Value
from teola_core.passes.estimates import LATENCY_KEY
from teola_langchain.components.classes import class_of
from teola_langchain.components.patched import runs_own_code
from teola_langchain.components.reads import reads, reshapes_only
from teola_langchain.execution import early_runs, steps
from teola_langchain.execution.context import StepRef
from teola_langchain.tracing import keys
from teola_langchain.tracing.traced import EarlyNote, SubGraph
from teola_langchain.tracing.values import DictValue, Ref, Sym

if TYPE_CHECKING:
    from teola_langchain.tracing.composites import Composites


def _ordered_models() -> tuple[type, ...]:
    """Models whose answer depends on how many calls came before (LangChain's list-fed fakes)."""
    from langchain_core.language_models.fake import FakeListLLM
    from langchain_core.language_models.fake_chat_models import (
        FakeListChatModel,
        FakeMessagesListChatModel,
        GenericFakeChatModel,
    )

    return (FakeListLLM, FakeListChatModel, FakeMessagesListChatModel, GenericFakeChatModel)


class EarlyStart:
    """Adds a sequence step that can start early to the graph `writer` is building (see the module docstring)."""

    def __init__(self, writer: Composites) -> None:
        self.w = writer

    def step(self, s: Runnable[Any, Any], sym: Sym, ref: StepRef) -> Sym | None:
        """The step's nodes, started early; None (with the reason noted) when it waits for `sym`."""
        if not isinstance(sym, DictValue):
            return None
        assign = class_of(s) is RunnableAssign and runs_own_code(s, RunnableAssign)
        body = s.mapper if assign else s
        read = reads(body)
        if read is None:
            return self._waits(s, ref, "reads its whole input")
        why = why_in_order(body)
        if why is not None:
            return self._waits(s, ref, why)
        if not does_work(body):
            return None  # nothing in it takes time: nothing to overlap
        sources = {k: self.w.field(sym, k) for k in sorted(read)}
        if not self._ready_before(list(sources.values()), sym.whole):
            return self._waits(s, ref, f"reads {_names(read)}, which the step ahead writes")
        self.w.session.early.append(
            EarlyNote(self._label(s, ref), True, f"reads {_names(read)}, ready before the step ahead ends")
        )
        return self._nodes(s, sym, ref, sources, assign)

    # -- what it reads -------------------------------------------------------------------
    def _ready_before(self, sources: list[Value], whole: Value) -> bool:
        """Work the dict `whole` waits for that none of `sources` waits for: what starting early overlaps."""
        b = self.w.b
        needed: set[str] = set()
        for v in sources:
            needed |= {v.node, *b.ancestors(v.node)}
        if whole.node in needed:
            return False
        return any(_is_work(b.node(n).engine, b.node(n).config) for n in b.ancestors(whole.node) - needed)

    # -- its nodes -----------------------------------------------------------------------
    def _nodes(
        self, s: Runnable[Any, Any], sym: DictValue, ref: StepRef, sources: dict[str, Value], assign: bool
    ) -> Sym:
        w, name = self.w, s.get_name()
        ports = {f"k{i}": v for i, v in enumerate(sources.values())}
        projection = w.b.call(early_runs.project(tuple(sources)), ports, name=f"{name}.project", inline=True)
        sub, scope = self._graph(s, ref, assign)
        started = w._user(early_runs.start_early(sub), {"value": projection}, "start_early", name)
        reached = w._user(early_runs.reach(sub, ref, scope), {"outcome": started, "value": w.whole(sym)}, "reach", name)
        if assign:
            return DictValue(reached, {**sym.fields, **self._fields_of(reached, s.mapper.steps__)}, rest=sym.rest)
        if class_of(s) is RunnableParallel and runs_own_code(s, RunnableParallel):
            return DictValue(reached, self._fields_of(reached, s.steps__))
        return Ref(reached)

    def _fields_of(self, value: Value, names: Any) -> dict[str, Value]:
        get = self.w.b.call
        return {k: get(steps.get_or_missing(k), {"value": value}, name="field", inline=True) for k in names}

    def _graph(self, s: Runnable[Any, Any], ref: StepRef, assign: bool) -> tuple[SubGraph, str | None]:
        """The step as a graph of its own (input: the projection). An `.assign`'s graph opens its
        run and runs its mapper; its output is the mapper's, and the run stays open for the merge."""
        w = self.w
        name = f"{w.name}/{s.get_name()}[early]"
        inner = type(w)(name, w.session, w.paths)
        scope = None
        if assign:
            scope, opened = inner._open(s, Ref(inner.input), ref)
            checked = inner.b.call(steps.require_dict, {"value": opened}, name=f"{s.get_name()}.check", inline=True)
            mapped = inner.step(s.mapper, Ref(checked), StepRef(scope, None))
            inner.b.output(output=inner.whole(mapped))
            graph = inner.b.build(chain_modules=False)
        else:
            graph = inner.trace(s, ref)
        sub = SubGraph(name, graph, graph)
        w.session.subgraphs.append(sub)
        return sub, scope

    # -- notes -----------------------------------------------------------------------------
    def _label(self, s: Runnable[Any, Any], ref: StepRef) -> str:
        return keys.short(self.w.key(s, ref))

    def _waits(self, s: Runnable[Any, Any], ref: StepRef, why: str) -> None:
        self.w.session.early.append(EarlyNote(self._label(s, ref), False, why))
        return None


def _names(read: frozenset[str]) -> str:
    return ", ".join(sorted(read)) or "no key"


def _is_work(engine: str | None, config: Any) -> bool:
    """A node that takes time: an engine call, or a step of the chain that does more than reshape data."""
    return engine is not None or (LATENCY_KEY in config and not config.get("reshapes_only", False))


def parts(step: Runnable[Any, Any]) -> Iterator[Runnable[Any, Any]]:
    """`step` and every runnable inside it that a composite LangChain knows would call."""
    yield step
    inner: list[Any] = []
    if isinstance(step, RunnableSequence):
        inner = list(step.steps)
    elif isinstance(step, RunnableParallel):
        inner = list(step.steps__.values())
    elif isinstance(step, RunnableAssign):
        inner = [step.mapper]
    elif isinstance(step, RunnableBranch):
        inner = [p for pair in step.branches for p in pair] + [step.default]
    elif isinstance(step, RunnableEach | RunnableBinding):
        inner = [step.bound]
    elif isinstance(step, RunnableWithFallbacks):
        inner = [step.runnable, *step.fallbacks]
    for part in inner:
        yield from parts(part)


def why_in_order(step: Runnable[Any, Any]) -> str | None:
    """Why `step` must run in order (None: it may start early): what would show its early run."""
    ordered = _ordered_models()
    for part in parts(step):
        label = part.get_name()
        if getattr(part, "callbacks", None):
            return f"{label} has callbacks of its own"
        if isinstance(part, RunnableBinding) and ((part.config or {}).get("callbacks") or part.config_factories):
            return f"{label} is bound to callbacks or listeners of its own"
        if getattr(part, "verbose", False) is True:
            return f"{label} prints as it runs (verbose)"
        if isinstance(part, ordered):
            return f"{label} answers in call order"
    return None


def does_work(step: Runnable[Any, Any]) -> bool:
    """Something in `step` takes time: a model, a retriever, or a step that is not a mere reshaping."""
    for part in parts(step):
        if isinstance(part, BaseLanguageModel | BaseRetriever):
            return True
        composite = isinstance(
            part, RunnableSequence | RunnableParallel | RunnableAssign | RunnableBranch | RunnableEach | RunnableBinding
        )
        if not composite and not isinstance(part, RunnableWithFallbacks) and not reshapes_only(part):
            return True
    return False
