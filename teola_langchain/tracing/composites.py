"""The composites Teola executes itself: sequence, parallel (and dict literals), `.assign`, branch, `.map()`.

Each becomes an `open` node (its callback run starts, as its code starts it), its
children, and a `close` node (the run ends with the output) (`execution/runs.py`); a parallel or an
`.assign` hands on a `DictValue` (`values.py`), so the steps after it know where each
field comes from. In the chain's own sequence, a step whose own `batch` a `batch()` call
must run is a barrier (`execution/batching.py`); `model | list parser | .map()` runs are pipelined
(`pipelining.py`); a step that reads only keys ready before the step ahead of it ends
starts early (`early_steps.py`). A `.map()` whose body batches per item runs the body's own graph on
each item (`GraphWriter.nested_graph`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableBranch, RunnableParallel, RunnableSequence
from langchain_core.runnables.base import RunnableEach
from langchain_core.runnables.passthrough import RunnableAssign

from teola_core.ir.builder import Value
from teola_core.ir.kinds import MergeMode, PrimitiveKind
from teola_langchain.components.models import language_model
from teola_langchain.components.retrievers import Decomposition, decompose
from teola_langchain.execution import steps
from teola_langchain.execution.context import StepRef
from teola_langchain.tracing.early_steps import EarlyStart
from teola_langchain.tracing.pipelining import PipelinedMaps
from teola_langchain.tracing.values import DictValue, Ref, Sym, carry


def assigned(base: Sym, mapped: Sym, merged: Value) -> DictValue:
    """What `.assign` hands on: `{**base, **mapped}` as `merged`, with the fields known of both.

    Keys the mapper adds override the base's; the base's other keys are read from the base
    itself (`rest`), so a step that reads only them need not wait for the mapper. A mapper
    whose keys are unknown leaves only the merged whole to read from.
    """
    if not isinstance(mapped, DictValue) or mapped.open:
        return DictValue(merged, {}, rest=merged)
    if isinstance(base, DictValue):
        return DictValue(merged, {**base.fields, **mapped.fields}, rest=base.rest)
    return DictValue(merged, dict(mapped.fields), rest=base.value)


class Composites(PipelinedMaps):
    """Adds the nodes of LangChain's composites (see the module docstring)."""

    def sequence(self, r: RunnableSequence[Any, Any], sym: Sym, ref: StepRef) -> Sym:
        scope, opened = self._open(r, sym, ref)
        current: Sym = carry(sym, opened)
        root = ref == StepRef()  # the chain itself: batch() calls it stage by stage (`execution/batching.py`)
        chain = list(r.steps)
        i = 0
        while i < len(chain):
            s = chain[i]
            child = StepRef(scope, f"seq:step:{i + 1}")
            if root:
                reached = self.b.call(
                    steps.reach_step(i), {"value": self.whole(current), "ctx": self.ctx}, name="reach", inline=True
                )
                current = carry(current, reached)
                if not steps.batches_per_item(s):
                    current = self.barrier_step(s, current, replace(child, barrier=i))
                    i += 1
                    continue
            pipeline = self._pipelinable(chain, i, scope)
            if pipeline is not None:
                current = self.pipelined(pipeline, current, scope, i)
                i += 4 if pipeline.trim is not None else 3
                continue
            early = EarlyStart(self).step(s, current, child) if i > 0 else None
            current = early if early is not None else self.step(s, current, child)
            i += 1
        closed = self._close(r, scope, self.whole(current))
        return carry(current, closed)

    def barrier_step(self, r: Runnable[Any, Any], sym: Sym, ref: StepRef) -> Sym:
        """A top-level step whose own `batch` a batch() call must run: a model, or one call."""
        if language_model(r) is not None:
            return self.model(r, sym, ref)
        return self.leaf(r, sym, ref, None)

    def parallel(self, r: RunnableParallel[Any], sym: Sym, ref: StepRef) -> Sym:
        scope, opened = self._open(r, sym, ref)
        given = carry(sym, opened)
        names = list(r.steps__)
        parts = {key: self.step(s, given, StepRef(scope, f"map:key:{key}")) for key, s in r.steps__.items()}
        inputs = {f"p{i}": self.whole(p) for i, p in enumerate(parts.values())}
        closed = self._user(steps.close_dict(scope, names), inputs, "close", r.get_name())
        return DictValue(closed, {key: self.whole(p) for key, p in parts.items()})

    def assign(self, r: RunnableAssign, sym: Sym, ref: StepRef) -> Sym:
        scope, opened = self._open(r, sym, ref)
        checked = self.b.call(steps.require_dict, {"value": opened}, name=f"{r.get_name()}.check", inline=True)
        mapped = self.step(r.mapper, carry(sym, checked), StepRef(scope, None))
        merged = self._user(
            steps.close_merge(scope), {"base": checked, "update": self.whole(mapped)}, "close", r.get_name()
        )
        return assigned(sym, mapped, merged)

    def branch(self, r: RunnableBranch[Any, Any], sym: Sym, ref: StepRef) -> Sym:
        scope, opened = self._open(r, sym, ref)
        given = carry(sym, opened)
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
            sub = self.nested_graph(f"{self.name}/{r.get_name()}", body, element)
            key = self.key(r, ref, "map")
            out = self._user(steps.run_map(sub), {"value": opened}, "map", r.get_name(), key)
        return Ref(self._close(r, scope, out))
