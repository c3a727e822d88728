"""Stimuli and instructions of the two scheduler state machines.

Both schedulers follow Dask's worker state machine: `handle(event) -> [action]`. Events
(stimuli) say what happened and carry the time it happened (`now`), so a scheduler never
reads a clock; actions (instructions) say what the runtime must do. All are frozen,
so a test can feed events one by one and compare the actions exactly:

    gs = GraphScheduler()
    [dispatch] = gs.handle(QuerySubmitted(query_id="q", graph=g, inputs={"x": 1}, now=0.0))
    gs.handle(NodeFinished(query_id="q", node_id=dispatch.node.id, outputs={...}, now=1.0))

Graph scheduler: `QuerySubmitted`, `NodeStarted`, `NodeFinished`, `NodeFailed`,
`NodeWithdrawn`, `QueryCancelRequested` in; `Dispatch`, `QueryDone`, `QueryFailed`,
`CancelNodes`, `WithdrawNode` out. Engine scheduler: `NodeReady`, `BatchFinished`,
`QueryCancelRequested`, `ConcurrencyChanged`, `WithdrawRequested` in; `RunBatch`,
`CancelBatch`, `Withdrawn` out. A speculative node (`teola_core.ir.speculation`) given
up goes `WithdrawNode` -> `WithdrawRequested` -> `Withdrawn` (only if its engine had not
started it) -> `NodeWithdrawn`. Stream groups (`streams`): see `teola_core.scheduler.streams`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from teola_core.engines.protocol import Call
from teola_core.ir.errors import TeolaError
from teola_core.ir.graph import Graph
from teola_core.ir.node import Node


class SchedulerError(TeolaError):
    """A scheduler was fed an event its state does not allow (a runtime bug)."""


# -- graph scheduler: events -------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class QuerySubmitted:
    """A query arrives. `depths`: node id -> depth to the output (None: path length in
    nodes). `arrival`: when the query arrived, for engine-side ordering (None: `now`)."""

    query_id: str
    graph: Graph
    inputs: Mapping[str, Any]
    now: float
    depths: Mapping[str, float] | None = None
    arrival: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeStarted:
    """A dispatched node left its engine queue and began to run (optional, for stories)."""

    query_id: str
    node_id: str
    now: float


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeFinished:
    """A dispatched node produced its outputs (port name -> value)."""

    query_id: str
    node_id: str
    outputs: Mapping[str, Any]
    now: float


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeFailed:
    """A dispatched node raised; the query fails with the error chained."""

    query_id: str
    node_id: str
    error: BaseException
    now: float


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryCancelRequested:
    """Stop a query: the graph scheduler forgets it, engine schedulers drop its nodes."""

    query_id: str
    now: float


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeWithdrawn:
    """A speculative node was given up before its engine started it: it settles with its
    speculation's withdrawn outputs."""

    query_id: str
    node_id: str
    now: float


GraphEvent = QuerySubmitted | NodeStarted | NodeFinished | NodeFailed | NodeWithdrawn | QueryCancelRequested


# -- graph scheduler: actions ------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Dispatch:
    """Run `node` of query `query_id` on `inputs`.

    The node itself travels (not a bare request), so the engine side knows whose it is
    and where it stands in its graph: `depth` (to the output) and the query's `arrival`.
    """

    query_id: str
    node: Node
    inputs: Mapping[str, Any]
    depth: float
    arrival: float


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryDone:
    """Every node settled; `outputs` are the output node's input values."""

    query_id: str
    outputs: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryFailed:
    """The query failed: `error` names the primitive (a `PrimitiveError`) or the input."""

    query_id: str
    error: BaseException


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelNodes:
    """Stop these dispatched nodes of a failed or cancelled query; their results are moot."""

    query_id: str
    node_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class WithdrawNode:
    """Give up a dispatched speculative node if its engine has not started it (it is all its
    consumer still waits for); a started one runs on."""

    query_id: str
    node: Node


GraphAction = Dispatch | QueryDone | QueryFailed | CancelNodes | WithdrawNode


# -- engine scheduler --------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class NodeReady:
    """A dispatched engine node joins its engine's queue.

    `items`: how much of a batch it fills (`Call.items`). `stream`: it runs as a stream
    (a partial-decode group), alone in its batch and holding a slot until the stream ends.
    """

    query_id: str
    node: Node
    inputs: Mapping[str, Any]
    depth: float
    arrival: float
    items: int
    now: float
    stream: bool = False

    @classmethod
    def from_dispatch(cls, dispatch: Dispatch, now: float, *, stream: bool = False) -> NodeReady:
        call = Call(dispatch.query_id, dispatch.node, dispatch.inputs)
        return cls(
            query_id=dispatch.query_id,
            node=dispatch.node,
            inputs=dispatch.inputs,
            depth=dispatch.depth,
            arrival=dispatch.arrival,
            items=call.items,
            now=now,
            stream=stream,
        )

    def call(self) -> Call:
        return Call(self.query_id, self.node, self.inputs, arrival=self.arrival)

    @property
    def solo(self) -> bool:
        """Runs alone: a stream, or a node its engine declared not batchable."""
        return self.stream or not self.node.caps.batchable


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchFinished:
    """A batch ended, however (returned, failed, cancelled, even before it ran a step):
    its concurrency slot is free. The runtime reports it exactly once per `RunBatch`."""

    batch_id: int
    now: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ConcurrencyChanged:
    """The engine may now run `concurrency` batches at once (a server's learned bound): more
    start if slots opened; running batches are never stopped when it shrinks."""

    concurrency: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WithdrawRequested:
    """Drop a speculative node still queued (`Withdrawn` says it was); no-op once started."""

    query_id: str
    node_id: str
    now: float


EngineEvent = NodeReady | BatchFinished | QueryCancelRequested | ConcurrencyChanged | WithdrawRequested


@dataclass(frozen=True, slots=True, kw_only=True)
class RunBatch:
    """Invoke the engine on `calls` (`engine.stream(calls[0])` when `stream`)."""

    engine: str
    batch_id: int
    calls: tuple[Call, ...]
    stream: bool = False

    @property
    def items(self) -> int:
        return sum(c.items for c in self.calls)


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelBatch:
    """Stop a running batch: every query it holds calls of has ended. Its slot stays held
    until the batch's `BatchFinished` comes back."""

    engine: str
    batch_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Withdrawn:
    """A queued speculative node was dropped before it started."""

    query_id: str
    node: Node


EngineAction = RunBatch | CancelBatch | Withdrawn
