"""What tracing a chain gives: its graphs (as traced and as they run), what stayed opaque,
the steps whose run times the plan uses, and where an optimization is blocked."""

from __future__ import annotations

from dataclasses import dataclass, field

from teola_core.ir.graph import Graph
from teola_langchain.tracing.advice import StepInfo


@dataclass
class SubGraph:
    """One traced graph: `pgraph` as traced, `graph` what runs (the e-graph after passes)."""

    name: str
    pgraph: Graph
    graph: Graph
    passes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Blocked:
    """A place where an optimization could apply but does not: the step, why, what would help."""

    key: str
    why: str
    advice: str


@dataclass(frozen=True)
class EarlyNote:
    """Whether a sequence step starts before the step ahead of it ends (`early_steps.py`), and why."""

    step: str
    early: bool
    why: str

    def __str__(self) -> str:
        return f"{self.step}: {'starts early' if self.early else 'waits for the step ahead'}: {self.why}"


@dataclass
class TracedChain:
    """The result of tracing: the main graph, nested graphs (map bodies), what stayed opaque.

    steps: the key of every step whose run time the plan uses, with what it is;
    blocked: where decode pipelining could apply and does not;
    early: which sequence steps start before the step ahead of them ends, and why the others wait.
    """

    main: SubGraph
    subgraphs: list[SubGraph]
    opaque: list[str]
    steps: dict[str, StepInfo] = field(default_factory=dict)
    blocked: list[Blocked] = field(default_factory=list)
    early: list[EarlyNote] = field(default_factory=list)

    def graphs(self) -> list[SubGraph]:
        return [self.main, *self.subgraphs]

    @property
    def uses_engines(self) -> bool:
        """Whether any graph runs a primitive on an engine (a model, an embedding, a search)."""
        return any(n.engine is not None for g in self.graphs() for n in g.graph.nodes.values())
