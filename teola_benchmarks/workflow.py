"""Workflow templates: modules with an execution order, instantiated per query.

A template is what an application developer registers once; each query instantiates
it into its own p-graph, shaped by that query's inputs (how many documents to index,
how many expanded queries to search).

    template = WorkflowTemplate(
        "naive_rag",
        inputs={"question": PortType.TEXT, "documents": PortType.TEXTS},
        modules=[Module("indexing", build_indexing), Module("synthesis", build_synthesis)],
        outputs=("answer",),
    )
    graph = template.instantiate({"question": "...", "documents": [...]})

Each module's `build(builder, env)` adds its primitives and returns the values it
makes available to later modules, by name: `env.values` holds the inputs and what
earlier modules returned; `env.query` holds the query's concrete input values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from teola_core.ir.builder import CapsFor, GraphBuilder, Value
from teola_core.ir.errors import GraphError
from teola_core.ir.graph import Graph
from teola_core.ir.types import PortType


@dataclass
class ModuleEnv:
    query: Mapping[str, Any]
    values: dict[str, Value] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Value:
        try:
            return self.values[name]
        except KeyError:
            raise GraphError(f"no value named {name!r} yet (have {sorted(self.values)})") from None


ModuleBuild = Callable[[GraphBuilder, ModuleEnv], Mapping[str, Value] | None]


@dataclass(frozen=True)
class Module:
    name: str
    build: ModuleBuild


@dataclass(frozen=True)
class WorkflowTemplate:
    name: str
    inputs: Mapping[str, PortType]
    modules: Sequence[Module]
    outputs: Sequence[str]
    config: Mapping[str, Any] = field(default_factory=dict)

    def instantiate(self, query: Mapping[str, Any], *, caps_for: CapsFor | None = None) -> Graph:
        """Build this query's p-graph (modules chained in their declared order)."""
        missing = [name for name in self.inputs if name not in query]
        if missing:
            raise GraphError(f"workflow {self.name!r}: query is missing input field(s) {missing}")
        unknown = [name for name in query if name not in self.inputs]
        if unknown:
            raise GraphError(f"workflow {self.name!r}: unknown query field(s) {unknown}")
        builder = GraphBuilder(self.name, caps_for=caps_for)
        env = ModuleEnv(query=query, config=self.config)
        for name, type_ in self.inputs.items():
            value = query[name]
            items = len(value) if isinstance(value, list | tuple) else None
            env.values[name] = builder.input(name, type_, items=items)
        for module in self.modules:
            with builder.module(module.name):
                produced = module.build(builder, env) or {}
            env.values.update(produced)
        builder.output(**{name: env[name] for name in self.outputs})
        return builder.build()
