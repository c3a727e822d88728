"""The graph one trace is writing: its inputs, the nodes that run the chain's own code, and step keys.

Every traced graph has two inputs, "input" (the chain's input) and "context" (the query's
`QueryContext`). `GraphWriter` holds its `GraphBuilder` and adds the nodes every kind of
step needs: a call of the chain's own code (`_user`, `_itemwise`), a composite's callback
run opened and closed (`_open`, `_close`), and the step key of a step (`key`, `keys.py`)
that nodes charge their run time to. The layers above it add the nodes of each kind of
step (`step_nodes.py`, `pipelining.py`, `composites.py`); `tracer.GraphTracer`
dispatches a step to them (`step`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from langchain_core.runnables import Runnable

from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import Capabilities, MergeMode, PortSpec, PrimitiveKind
from teola_core.ir.types import PortType
from teola_core.passes.estimates import LATENCY_KEY
from teola_langchain.components.models import is_binding
from teola_langchain.execution import steps
from teola_langchain.execution.context import StepRef
from teola_langchain.tracing import keys
from teola_langchain.tracing.advice import StepInfo, opaque_advice
from teola_langchain.tracing.session import TraceSession
from teola_langchain.tracing.traced import Blocked, SubGraph
from teola_langchain.tracing.values import Ref, Sym


class GraphWriter(ABC):
    """One graph under construction, and the nodes every kind of step is made of."""

    def __init__(self, name: str, session: TraceSession, paths: dict[str | None, str] | None = None) -> None:
        self.session = session
        self.name = name
        self.b = GraphBuilder(name)
        self.input = self.b.input("input")
        self.ctx = self.b.input("context")
        self.paths: dict[str | None, str] = {None: keys.CHAIN, **(paths or {})}  # run scope -> its step key

    @abstractmethod
    def step(self, r: Runnable[Any, Any], sym: Sym, ref: StepRef) -> Sym:
        """The nodes of step `r` on input `sym`: what every composite recurses through."""

    def trace(self, runnable: Runnable[Any, Any], ref: StepRef) -> Graph:
        """The whole graph: `runnable` from the graph's "input" to its "output"."""
        result = self.step(runnable, Ref(self.input), ref)
        self.b.output(output=self.whole(result))
        return self.b.build(chain_modules=False)

    def nested_graph(self, name: str, body: Runnable[Any, Any], ref: StepRef) -> SubGraph:
        """A graph of its own for `body` (a `.map()`'s), traced in this session with this graph's run scopes."""
        graph = type(self)(name, self.session, self.paths).trace(body, ref)
        sub = SubGraph(name, graph, graph)
        self.session.subgraphs.append(sub)
        return sub

    @staticmethod
    def whole(sym: Sym) -> Value:
        return sym.value if isinstance(sym, Ref) else sym.whole

    def _user(
        self, fn: Any, inputs: dict[str, Value], name: str, label: str, key: str | None = None, cheap: bool = False
    ) -> Value:
        """A call of the chain's own code: `fn` gets the node's inputs and the query's context.

        cheap: the step only reshapes data (`reads.reshapes_only`): not work a step could overlap.
        """
        return self._call(fn, {**inputs, "ctx": self.ctx}, name, label, inline=False, key=key, cheap=cheap)

    def _itemwise(
        self, fn: Any, inputs: dict[str, Value], name: str, label: str, inline: bool = False, key: str | None = None
    ) -> Value:
        """A call on item-aligned lists ("items", "hits"): replicated per part when its input is split."""
        ports = {**inputs} if inline else {**inputs, "ctx": self.ctx}
        item_ports = tuple(p for p in ports if p in ("items", "hits"))
        caps = Capabilities(True, True, item_ports, "value", MergeMode.CONCAT)
        return self._call(fn, ports, name, label, inline=inline, key=key, caps=caps)

    def _call(
        self,
        fn: Any,
        ports: dict[str, Value],
        name: str,
        label: str,
        *,
        inline: bool,
        key: str | None,
        caps: Capabilities | None = None,
        cheap: bool = False,
    ) -> Value:
        """A CALL node of `fn` on `ports`, charged to step `key` (when given)."""
        config = {"fn": fn, "inline": inline, **({LATENCY_KEY: key} if key is not None else {})}
        if cheap:
            config["reshapes_only"] = True
        node = self.b.add(
            PrimitiveKind.CALL,
            ports,
            config=config,
            input_ports=tuple(PortSpec(p, PortType.ANY) for p in ports),
            output_ports=(PortSpec("value", PortType.ANY),),
            name=f"{label}.{name}",
            label=label,
            caps=caps,
        )
        return Value(node.id, "value")

    def _scope(self, label: str) -> str:
        return f"{label}#{next(self.session.scopes)}"  # unique in the session: nested graphs see outer runs

    def key(
        self,
        r: Runnable[Any, Any],
        ref: StepRef,
        kind: str | None = None,
        opaque: str | None = None,
        runs_as: str | None = None,
    ) -> str:
        """The step key of `r` at `ref` (`keys.py`); with `kind`, recorded for explain() (with
        why it runs as one call, or the primitives it runs as)."""
        if ref.scope is None and ref.tag is None:
            key = keys.CHAIN  # the chain itself (or the whole of it, one step)
        else:
            key = keys.child_key(self.paths[ref.scope], _run_name(r, ref), ref.tag)
        if kind is not None:
            advice = opaque_advice(r, opaque) if opaque is not None else None
            self.session.steps.setdefault(key, StepInfo(kind, type(r).__name__, opaque, advice, runs_as))
        return key

    def _block(self, r: Runnable[Any, Any], ref: StepRef, why: str, advice: str) -> None:
        self.session.blocked.append(Blocked(self.key(r, ref), why, advice))

    def _open(self, r: Runnable[Any, Any], sym: Sym, ref: StepRef) -> tuple[str, Value]:
        scope = self._scope(r.get_name())
        self.paths[scope] = self.key(r, ref)
        opened = self._user(steps.open_run(scope, ref, r.get_name()), {"value": self.whole(sym)}, "open", r.get_name())
        return scope, opened

    def _close(self, r: Runnable[Any, Any], scope: str, value: Value) -> Value:
        return self._user(steps.close_run(scope), {"value": value}, "close", r.get_name())


def _run_name(r: Runnable[Any, Any], ref: StepRef) -> str:
    """The name of the step's callback run: the outermost binding's `run_name`, else its own name."""
    configs = [r.config, *ref.bound] if is_binding(r) else list(ref.bound)
    name = None
    for config in configs:  # innermost first: an outer binding's config overrides an inner one's
        name = config.get("run_name") or name
    return name or r.get_name()
