"""Building p-graphs by hand or from a template: values are explicit handles.

Every primitive takes the `Value`s it consumes and returns the `Value`s it produces, so
the dataflow is stated, never guessed from names.

    b = GraphBuilder("naive_rag")
    question = b.input("question", PortType.TEXT)
    with b.module("retrieval"):
        vectors = b.embed(b.call(lambda q: [q], {"q": question}), engine="embedder", items=1)
        hits = b.search(vectors, index, engine="vectordb", top_k=3, items=1)
    b.output(answer=...)
    graph = b.build()

Modules are built in their execution order; `build()` chains them with order-only
control edges (module i's sinks before module i+1's sources), which is what a
module-by-module framework does. Dependency pruning later drops the ones no data needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from teola_core.ir.errors import GraphError
from teola_core.ir.graph import Graph, GraphEditor
from teola_core.ir.kinds import Capabilities, MergeMode, PortSpec, PrimitiveKind, spec_of
from teola_core.ir.node import ControlEdge, DataEdge, DecodePart, ItemSlice, Node
from teola_core.ir.prompt import PromptTemplate
from teola_core.ir.split_units import SplitUnit
from teola_core.ir.types import PortType
from teola_core.ir.validate import validate


@dataclass(frozen=True)
class Value:
    """A handle on one output port of one node (optionally a slice of its items)."""

    node: str
    port: str
    select: ItemSlice | None = None

    def __getitem__(self, s: slice) -> Value:
        if not isinstance(s, slice) or s.step not in (None, 1) or s.start is None or s.stop is None:
            raise TypeError("a Value can only be sliced as value[start:stop]")
        return Value(self.node, self.port, ItemSlice(s.start, s.stop))


CapsFor = Callable[[str, PrimitiveKind, Capabilities], Capabilities]


class GraphBuilder:
    """Builds one graph. `caps_for(engine, kind, caps)` lets engines narrow capabilities."""

    def __init__(self, name: str = "graph", caps_for: CapsFor | None = None) -> None:
        self._editor = GraphEditor(name=name)
        self._caps_for = caps_for
        self._module: str | None = None
        self._modules: dict[str, list[str]] = {}
        self._guards: list[tuple[str, int]] = []
        self._has_output = False

    # -- generic ---------------------------------------------------------------------
    def add(
        self,
        kind: PrimitiveKind,
        inputs: Mapping[str, Value],
        *,
        engine: str | None = None,
        config: Mapping[str, Any] | None = None,
        items: int | None = None,
        input_ports: Sequence[PortSpec] | None = None,
        output_ports: Sequence[PortSpec] | None = None,
        name: str | None = None,
        label: str | None = None,
        caps: Capabilities | None = None,
        part: DecodePart | None = None,
    ) -> Node:
        spec = spec_of(kind)
        in_ports = tuple(input_ports) if input_ports is not None else spec.inputs
        out_ports = tuple(output_ports) if output_ports is not None else spec.outputs
        if in_ports is None or out_ports is None:
            raise GraphError(f"{kind.value} primitives need their ports declared")
        caps = caps or spec.caps
        if engine is not None and self._caps_for is not None:
            caps = self._caps_for(engine, kind, caps)
        base = f"{self._module}.{name or kind.value}" if self._module else (name or kind.value)
        node = Node(
            id=self._editor.fresh_id(base),
            kind=kind,
            inputs=in_ports,
            outputs=out_ports,
            engine=engine,
            config=dict(config or {}),
            caps=caps,
            items=items,
            module=self._module,
            label=label or self._module,
            part=part,
        )
        self._editor.add_node(node)
        for port, value in inputs.items():
            self._editor.connect(DataEdge(value.node, value.port, node.id, port, value.select))
        for cond, branch in self._guards:
            self._editor.connect(ControlEdge(cond, node.id, branch))
        if self._module is not None:
            self._modules[self._module].append(node.id)
        return node

    @contextmanager
    def module(self, name: str) -> Iterator[None]:
        """Nodes created inside belong to module `name` (modules run in creation order)."""
        if self._module is not None:
            raise GraphError(f"module {name!r} opened inside module {self._module!r}")
        self._modules.setdefault(name, [])
        self._module = name
        try:
            yield
        finally:
            self._module = None

    @contextmanager
    def branch(self, condition: Value, index: int) -> Iterator[None]:
        """Nodes created inside run only if `condition` chose branch `index`."""
        self._guards.append((condition.node, index))
        try:
            yield
        finally:
            self._guards.pop()

    # -- structural ------------------------------------------------------------------
    def input(self, name: str, type_: PortType = PortType.ANY, items: int | None = None) -> Value:
        node = Node(
            id=self._editor.fresh_id(f"input.{name}"),
            kind=PrimitiveKind.INPUT,
            inputs=(),
            outputs=(PortSpec("value", type_),),
            config={"name": name},
            items=items,
        )
        self._editor.add_node(node)
        return Value(node.id, "value")

    def output(self, **values: Value) -> None:
        if self._has_output:
            raise GraphError("output() was already called")
        ports = tuple(PortSpec(name, PortType.ANY) for name in values)
        node = Node(id=self._editor.fresh_id("output"), kind=PrimitiveKind.OUTPUT, inputs=ports, outputs=())
        self._editor.add_node(node)
        for port, value in values.items():
            self._editor.connect(DataEdge(value.node, value.port, node.id, port, value.select))
        self._has_output = True

    # -- engine primitives -----------------------------------------------------------
    def embed(self, texts: Value, *, engine: str, items: int | None = None, **config: Any) -> Value:
        node = self.add(PrimitiveKind.EMBED, {"texts": texts}, engine=engine, items=items, config=config)
        return Value(node.id, "vectors")

    def ingest(self, texts: Value, vectors: Value, *, engine: str, items: int | None = None, **config: Any) -> Value:
        node = self.add(
            PrimitiveKind.INGEST, {"texts": texts, "vectors": vectors}, engine=engine, items=items, config=config
        )
        return Value(node.id, "index")

    def search(
        self, vectors: Value, index: Value, *, engine: str, top_k: int, items: int | None = None, **config: Any
    ) -> Value:
        node = self.add(
            PrimitiveKind.SEARCH,
            {"vectors": vectors, "index": index},
            engine=engine,
            items=items,
            config={"top_k": top_k, **config},
        )
        return Value(node.id, "hits")

    def rerank(
        self, query: Value, docs: Value, *, engine: str, top_k: int, items: int | None = None, **config: Any
    ) -> Value:
        node = self.add(
            PrimitiveKind.RERANK,
            {"query": query, "docs": docs},
            engine=engine,
            items=items,
            config={"top_k": top_k, **config},
        )
        return Value(node.id, "docs")

    def llm(
        self,
        prompt: Value,
        *,
        engine: str,
        max_tokens: int,
        split_unit: SplitUnit | None = None,
        expected_items: int | None = None,
        name: str = "llm",
        **sampling: Any,
    ) -> LLMOutput:
        """An LLM call: a prefill primitive and a decode primitive.

        With a `split_unit` the decode also outputs its parsed `items` and is splittable
        (decode pipelining); `expected_items` is how many items to plan stages for.
        """
        prefill = self.add(
            PrimitiveKind.PREFILL, {"prompt": prompt}, engine=engine, name=f"{name}.prefill", config=sampling
        )
        config: dict[str, Any] = {"max_tokens": max_tokens, **sampling}
        if split_unit is not None:
            config["split_unit"] = split_unit
            if expected_items is not None:
                config["expected_items"] = expected_items
        decode = self.decode(
            prefill,
            engine=engine,
            name=f"{name}.decode",
            config=config,
            splittable=split_unit is not None,
            items=expected_items,
        )
        return LLMOutput(Value(decode.id, "text"), Value(decode.id, "items") if split_unit else None)

    def decode(
        self,
        prefill: Node,
        *,
        engine: str,
        name: str,
        config: Mapping[str, Any],
        splittable: bool = False,
        items: int | None = None,
        label: str | None = None,
    ) -> Node:
        """The DECODE of `prefill`'s KV, outputting `text`. A `splittable` one also outputs
        its parsed `items` and may be split into stages (decode pipelining): every front
        end that plans decode pipelining declares it the same way."""
        outputs = [PortSpec("text", PortType.TEXT)]
        caps = None  # the kind's own
        if splittable:
            outputs.append(PortSpec("items", PortType.ITEMS))
            caps = Capabilities(True, True, (), "items", MergeMode.CONCAT)
        return self.add(
            PrimitiveKind.DECODE,
            {"kv": Value(prefill.id, "kv")},
            engine=engine,
            name=name,
            label=label,
            config=config,
            output_ports=outputs,
            items=items,
            caps=caps,
        )

    # -- inline and user primitives --------------------------------------------------
    def format(self, template: PromptTemplate | str, **variables: Value) -> Value:
        parsed = PromptTemplate.parse(template) if isinstance(template, str) else template
        missing = set(parsed.variables) - set(variables)
        if missing:
            raise GraphError(f"format: template variables {sorted(missing)} have no value")
        ports = tuple(PortSpec(v, PortType.ANY) for v in parsed.variables)
        node = self.add(
            PrimitiveKind.FORMAT,
            {v: variables[v] for v in parsed.variables},
            config={"template": parsed},
            input_ports=ports,
        )
        return Value(node.id, "prompt")

    def call(
        self,
        fn: Callable[..., Any],
        inputs: Mapping[str, Value],
        *,
        outputs: Sequence[str] = ("value",),
        name: str = "call",
        label: str | None = None,
        inline: bool = False,
    ) -> Value:
        """Run `fn(**inputs)` (sync or async); with several outputs `fn` returns a dict.

        A plain function runs in a worker thread (it may block) unless `inline=True`
        declares it cheap and non-blocking, to run on the event loop.
        """
        node = self.add(
            PrimitiveKind.CALL,
            inputs,
            config={"fn": fn, "inline": inline},
            input_ports=tuple(PortSpec(p, PortType.ANY) for p in inputs),
            output_ports=tuple(PortSpec(p, PortType.ANY) for p in outputs),
            name=name,
            label=label,
        )
        return Value(node.id, outputs[0])

    def call_outputs(self, value: Value, port: str) -> Value:
        """Another output port of the node behind `value` (for multi-output calls)."""
        return Value(value.node, port)

    def aggregate(self, parts: Sequence[Value], mode: MergeMode, **config: Any) -> Value:
        ports = tuple(PortSpec(f"part_{i}", PortType.ANY, optional=mode == MergeMode.SELECT) for i in range(len(parts)))
        node = self.add(
            PrimitiveKind.AGGREGATE,
            {f"part_{i}": v for i, v in enumerate(parts)},
            config={"mode": mode, **config},
            input_ports=ports,
        )
        return Value(node.id, "value")

    def condition(self, value: Value, predicate: Callable[[Any], int], branches: int, name: str = "condition") -> Value:
        """`predicate(value)` returns the index of the branch to run (0..branches-1)."""
        node = self.add(
            PrimitiveKind.CONDITION, {"value": value}, config={"predicate": predicate, "branches": branches}, name=name
        )
        return Value(node.id, "branch")

    def after(self, first: Value | str, then: Value | str) -> None:
        """Pin an order no data states (a side effect): kept by dependency pruning."""
        src = first.node if isinstance(first, Value) else first
        dst = then.node if isinstance(then, Value) else then
        self._editor.connect(ControlEdge(src, dst, pinned=True))

    def ancestors(self, node: str) -> set[str]:
        """Every node `node` waits for (so far), through data and control edges."""
        seen: set[str] = set()
        todo = [node]
        while todo:
            current = todo.pop()
            for edge in (*self._editor.data_in(current), *self._editor.control_in(current)):
                if edge.src not in seen:
                    seen.add(edge.src)
                    todo.append(edge.src)
        return seen

    def node(self, node_id: str) -> Node:
        """A node added so far."""
        return self._editor.nodes[node_id]

    # -- finish ----------------------------------------------------------------------
    def build(self, *, chain_modules: bool = True) -> Graph:
        if not self._has_output:
            raise GraphError(f"graph {self._editor.name!r} has no output: call output() first")
        if chain_modules:
            self._chain_modules()
        graph = self._editor.freeze()
        validate(graph)
        return graph

    def _chain_modules(self) -> None:
        ordered = [(name, ids) for name, ids in self._modules.items() if ids]
        for (_, before), (_, after) in pairwise(ordered):
            inside_before, inside_after = set(before), set(after)
            sinks = [n for n in before if not any(e.dst in inside_before for e in self._editor.data_out(n))]
            sources = [n for n in after if not any(e.src in inside_after for e in self._editor.data_in(n))]
            for s in sinks:
                for t in sources:
                    self._editor.connect(ControlEdge(s, t))


@dataclass(frozen=True)
class LLMOutput:
    text: Value
    items: Value | None
