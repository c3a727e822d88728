"""The graph scheduler: tracks every running query's e-graph and says which node runs next.

A pure state machine after Dask's `worker_state_machine`: `handle(event)` updates state and
returns actions (see `teola_core.scheduler.events`); no I/O, no clock, no engines. What a
graph computes is defined by `teola_core.runtime.reference`; this machine reaches the same
outputs, only as early as the dependencies allow.

State, per query (`_Query`), over the node indexes of its graph's `_Plan`:

    state      node -> waiting | ready | running | done | skipped | failed | cancelled
    remaining  node -> in-edges (data and control) whose source has not settled yet
    skip       node -> some settled source decided that this node is skipped
    outputs    node -> its output values, once done
    in_flight  dispatched nodes not yet finished (ready or running)
    unsettled  nodes neither done nor skipped; the query is done when it reaches 0
    story      every transition (node, from, to, time, cause), for `InvalidTransition`

Per graph, once (`_Plan`, cached by graph): node indexes, in-edge counts, each node's
producers (for its inputs) and consumers (data edges: does a skip propagate along it;
control edges: the guard's branch).

Transitions:

    waiting -> ready     every source settled and none says skip: `Dispatch` (input and
                         output nodes are completed here instead: they are bookkeeping)
    waiting -> skipped   every source settled and one says skip: a required data input
                         is skipped, or a guard's condition was skipped or chose another
                         branch (exactly as the reference evaluator); a plain order edge
                         from a skipped node does not skip its dependent
    ready   -> running   `NodeStarted` (optional: the runtime says the engine began)
    ready|running -> done     `NodeFinished`; its consumers' counters drop
    ready|running -> failed   `NodeFailed`: `QueryFailed` + `CancelNodes` for the rest
    *       -> cancelled      `QueryCancelRequested` (or another node failed)

Settling a node touches only its out-edges and the inputs of the nodes it makes ready,
so an event costs O(affected nodes), whatever the size of the graph or the number of
queries. A query that ends (done, failed, cancelled) is forgotten; late events for it
(results of batches already running) are dropped.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from teola_core.ir.errors import GraphError, PrimitiveError
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.node import ItemSlice, Node
from teola_core.scheduler.events import (
    CancelNodes,
    Dispatch,
    GraphAction,
    GraphEvent,
    NodeFailed,
    NodeFinished,
    NodeStarted,
    QueryCancelRequested,
    QueryDone,
    QueryFailed,
    QuerySubmitted,
    SchedulerError,
)


class NodeState(StrEnum):
    WAITING = "waiting"
    READY = "ready"
    RUNNING = "running"
    DONE = "done"
    SKIPPED = "skipped"
    FAILED = "failed"
    CANCELLED = "cancelled"


_W, _R, _X, _D, _S, _F, _C = (
    NodeState.WAITING,
    NodeState.READY,
    NodeState.RUNNING,
    NodeState.DONE,
    NodeState.SKIPPED,
    NodeState.FAILED,
    NodeState.CANCELLED,
)


@dataclass(frozen=True, slots=True)
class Transition:
    """One line of a node's story."""

    node_id: str
    start: NodeState
    finish: NodeState
    now: float
    cause: str


class InvalidTransition(SchedulerError):
    """An event asked a node for a transition its state does not allow; carries its story."""

    def __init__(
        self, query_id: str, node_id: str, start: NodeState | None, finish: str, story: list[Transition]
    ) -> None:
        lines = "\n".join(f"  {t.now:.6f} {t.start} -> {t.finish} ({t.cause})" for t in story) or "  (no story)"
        where = f"in state {start}" if start is not None else "unknown to the query"
        super().__init__(f"query {query_id}: node {node_id!r} {where} cannot become {finish}; story:\n{lines}")
        self.query_id = query_id
        self.node_id = node_id
        self.start = start
        self.finish = finish
        self.story = story


# Roles a plan gives its nodes: completed by the scheduler itself, or dispatched.
_INPUT, _OUTPUT, _DISPATCHED = 0, 1, 2


@dataclass(frozen=True, slots=True)
class _Plan:
    """A graph's indexes, built once and shared by every query that runs the graph."""

    graph: Graph
    ids: tuple[str, ...]
    index: Mapping[str, int]
    nodes: tuple[Node, ...]
    roles: tuple[int, ...]
    in_count: tuple[int, ...]
    # per node: (producer index, producer port, own port, slice) for each data in-edge
    producers: tuple[tuple[tuple[int, str, str, ItemSlice | None], ...], ...]
    # per node: (consumer index, skipped-if-this-is-skipped) for each data out-edge
    data_out: tuple[tuple[tuple[int, bool], ...], ...]
    # per node: (dependent index, guard branch or None) for each control out-edge
    control_out: tuple[tuple[tuple[int, int | None], ...], ...]
    is_condition: tuple[bool, ...]
    roots: tuple[int, ...]

    @classmethod
    def of(cls, graph: Graph) -> _Plan:
        ids = tuple(graph.nodes)
        index = {node_id: i for i, node_id in enumerate(ids)}
        nodes = tuple(graph.nodes[i] for i in ids)
        in_count = [0] * len(ids)
        producers: list[list[tuple[int, str, str, ItemSlice | None]]] = [[] for _ in ids]
        data_out: list[list[tuple[int, bool]]] = [[] for _ in ids]
        control_out: list[list[tuple[int, int | None]]] = [[] for _ in ids]
        for e in graph.data_edges:
            src, dst = index[e.src], index[e.dst]
            port = nodes[dst].input_port(e.dst_port)
            required = port is None or not port.optional
            producers[dst].append((src, e.src_port, e.dst_port, e.select))
            data_out[src].append((dst, required))
            in_count[dst] += 1
        for c in graph.control_edges:
            src, dst = index[c.src], index[c.dst]
            control_out[src].append((dst, c.branch))
            in_count[dst] += 1
        roles = tuple(
            _INPUT if n.kind == PrimitiveKind.INPUT else _OUTPUT if n.kind == PrimitiveKind.OUTPUT else _DISPATCHED
            for n in nodes
        )
        return cls(
            graph=graph,
            ids=ids,
            index=index,
            nodes=nodes,
            roles=roles,
            in_count=tuple(in_count),
            producers=tuple(tuple(p) for p in producers),
            data_out=tuple(tuple(d) for d in data_out),
            control_out=tuple(tuple(c) for c in control_out),
            is_condition=tuple(n.kind == PrimitiveKind.CONDITION for n in nodes),
            roots=tuple(i for i, n in enumerate(in_count) if n == 0),
        )


class _Query:
    """One query's mutable state (see the module docstring)."""

    __slots__ = (
        "arrival",
        "depths",
        "in_flight",
        "inputs",
        "outputs",
        "plan",
        "query_id",
        "remaining",
        "result",
        "skip",
        "state",
        "story",
        "unsettled",
    )

    def __init__(
        self, query_id: str, plan: _Plan, inputs: Mapping[str, Any], depths: tuple[float, ...], arrival: float
    ) -> None:
        n = len(plan.ids)
        self.query_id = query_id
        self.plan = plan
        self.inputs = inputs
        self.depths = depths
        self.arrival = arrival
        self.state: list[NodeState] = [_W] * n
        self.remaining: list[int] = list(plan.in_count)
        self.skip = bytearray(n)
        self.outputs: list[Mapping[str, Any] | None] = [None] * n
        self.in_flight: dict[int, None] = {}  # ordered set
        self.unsettled = n
        self.result: dict[str, Any] = {}
        self.story: list[Transition] = []


class _QueryEnded(Exception):
    """Raised inside a step when the query failed; `handle` turns it into actions."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class GraphScheduler:
    """Tracks many queries' graphs at once, keyed by query id.

    gs = GraphScheduler()
    actions = gs.handle(QuerySubmitted(query_id="q1", graph=g, inputs={...}, now=t))
    # run each Dispatch, then feed NodeFinished / NodeFailed back in
    """

    def __init__(self, depth_cost: Callable[[Node], float] | None = None) -> None:
        """depth_cost: a node's weight in depths (default 1: path length in nodes)."""
        self._depth_cost = depth_cost
        self._queries: dict[str, _Query] = {}
        self._plans: weakref.WeakKeyDictionary[Graph, tuple[_Plan, tuple[float, ...]]] = weakref.WeakKeyDictionary()

    # -- introspection -------------------------------------------------------------------
    def __contains__(self, query_id: object) -> bool:
        return query_id in self._queries

    @property
    def queries(self) -> tuple[str, ...]:
        return tuple(self._queries)

    def state(self, query_id: str, node_id: str) -> NodeState:
        q = self._queries[query_id]
        return q.state[q.plan.index[node_id]]

    def story(self, query_id: str, node_id: str | None = None) -> list[Transition]:
        story = self._queries[query_id].story
        return [t for t in story if node_id is None or t.node_id == node_id]

    def in_flight(self, query_id: str) -> tuple[str, ...]:
        q = self._queries[query_id]
        return tuple(q.plan.ids[i] for i in q.in_flight)

    # -- stimuli -------------------------------------------------------------------------
    def handle(self, event: GraphEvent) -> list[GraphAction]:
        """Apply one event; return what the runtime must do, in order."""
        if isinstance(event, QuerySubmitted):
            return self._submit(event)
        q = self._queries.get(event.query_id)
        if q is None:
            return []  # the query already ended: a late result of a batch already running
        actions: list[GraphAction] = []
        try:
            if isinstance(event, NodeFinished):
                self._finished(q, event, actions)
            elif isinstance(event, NodeStarted):
                i = self._index(q, event.node_id, _X)
                self._move(q, i, (_R,), _X, event.now, "started")
            elif isinstance(event, NodeFailed):
                i = self._index(q, event.node_id, _F)
                self._move(q, i, (_R, _X), _F, event.now, "failed")
                del q.in_flight[i]
                error = event.error
                if not isinstance(error, GraphError):  # as the reference: graph errors pass as they are
                    wrapped = PrimitiveError(q.query_id, q.plan.nodes[i].describe(), error)
                    wrapped.__cause__ = error
                    error = wrapped
                raise _QueryEnded(error)
            elif isinstance(event, QueryCancelRequested):
                return self._end(q, event.now, "cancel requested", None)
            else:
                raise SchedulerError(f"graph scheduler cannot handle {type(event).__name__}")
        except _QueryEnded as ended:
            return actions + self._end(q, event.now, "query failed", ended.error)
        if q.unsettled == 0:
            del self._queries[q.query_id]
            actions.append(QueryDone(query_id=q.query_id, outputs=q.result))
        return actions

    def _submit(self, event: QuerySubmitted) -> list[GraphAction]:
        if event.query_id in self._queries:
            raise SchedulerError(f"query {event.query_id!r} is already running")
        plan, default_depths = self._plan(event.graph)
        depths = default_depths if event.depths is None else tuple(float(event.depths.get(i, 0.0)) for i in plan.ids)
        arrival = event.now if event.arrival is None else event.arrival
        q = _Query(event.query_id, plan, event.inputs, depths, arrival)
        # Check the inputs first, so a query with a missing one dispatches nothing.
        for i in plan.roots:
            if plan.roles[i] == _INPUT and plan.nodes[i].config["name"] not in event.inputs:
                return [QueryFailed(query_id=q.query_id, error=self._missing_input(q, i))]
        self._queries[q.query_id] = q
        actions: list[GraphAction] = []
        try:
            self._resolve(q, deque(plan.roots), event.now, actions)
        except _QueryEnded as ended:
            return actions + self._end(q, event.now, "query failed", ended.error)
        if q.unsettled == 0:
            del self._queries[q.query_id]
            actions.append(QueryDone(query_id=q.query_id, outputs=q.result))
        return actions

    def _plan(self, graph: Graph) -> tuple[_Plan, tuple[float, ...]]:
        cached = self._plans.get(graph)
        if cached is None:
            plan = _Plan.of(graph)
            depth = graph.depths(self._depth_cost)
            cached = (plan, tuple(depth[i] for i in plan.ids))
            self._plans[graph] = cached
        return cached

    # -- transitions ---------------------------------------------------------------------
    def _index(self, q: _Query, node_id: str, finish: NodeState) -> int:
        i = q.plan.index.get(node_id)
        if i is None:
            raise InvalidTransition(q.query_id, node_id, None, finish, [])
        return i

    def _move(
        self, q: _Query, i: int, allowed: tuple[NodeState, ...], finish: NodeState, now: float, cause: str
    ) -> None:
        start = q.state[i]
        if start not in allowed:
            node_id = q.plan.ids[i]
            raise InvalidTransition(q.query_id, node_id, start, finish, [t for t in q.story if t.node_id == node_id])
        q.state[i] = finish
        q.story.append(Transition(q.plan.ids[i], start, finish, now, cause))

    def _finished(self, q: _Query, event: NodeFinished, actions: list[GraphAction]) -> None:
        i = self._index(q, event.node_id, _D)
        self._move(q, i, (_R, _X), _D, event.now, "finished")
        del q.in_flight[i]
        q.outputs[i] = event.outputs
        self._settle(q, i, event.now, actions)

    def _settle(self, q: _Query, first: int, now: float, actions: list[GraphAction]) -> None:
        """`first` is done or skipped: tell its dependents, resolve those now unblocked."""
        self._resolve(q, deque(), now, actions, settled=first)

    def _resolve(
        self, q: _Query, unblocked: deque[int], now: float, actions: list[GraphAction], settled: int | None = None
    ) -> None:
        """Settle `settled` (if given) and decide every node that becomes unblocked.

        A worklist, not recursion: a skip can cascade through a long chain.
        """
        plan, remaining, skip, state = q.plan, q.remaining, q.skip, q.state
        settled_queue: deque[int] = deque() if settled is None else deque((settled,))
        while settled_queue or unblocked:
            while settled_queue:
                n = settled_queue.popleft()
                q.unsettled -= 1
                done = state[n] is _D
                for dst, required in plan.data_out[n]:
                    if required and not done:
                        skip[dst] = 1
                    remaining[dst] -= 1
                    if remaining[dst] == 0:
                        unblocked.append(dst)
                if plan.control_out[n]:
                    outputs = q.outputs[n]
                    branch = outputs.get("branch") if done and plan.is_condition[n] and outputs else None
                    for dst, guard in plan.control_out[n]:
                        # Only a guard skips: a plain order edge from a skipped node
                        # just means "after", as a module chain past a branch needs.
                        if guard is not None and (not done or guard != branch):
                            skip[dst] = 1
                        remaining[dst] -= 1
                        if remaining[dst] == 0:
                            unblocked.append(dst)
            if unblocked:
                i = unblocked.popleft()
                if skip[i]:
                    self._move(q, i, (_W,), _S, now, "skipped")
                    settled_queue.append(i)
                    continue
                role = plan.roles[i]
                if role == _DISPATCHED:
                    self._move(q, i, (_W,), _R, now, "inputs ready")
                    q.in_flight[i] = None
                    actions.append(
                        Dispatch(
                            query_id=q.query_id,
                            node=plan.nodes[i],
                            inputs=self._gather(q, i),
                            depth=q.depths[i],
                            arrival=q.arrival,
                        )
                    )
                elif role == _INPUT:
                    name = plan.nodes[i].config["name"]
                    if name not in q.inputs:
                        raise _QueryEnded(self._missing_input(q, i))
                    self._move(q, i, (_W,), _D, now, "query input")
                    q.outputs[i] = {"value": q.inputs[name]}
                    settled_queue.append(i)
                else:
                    self._move(q, i, (_W,), _D, now, "output")
                    q.result = self._gather(q, i)
                    settled_queue.append(i)

    def _gather(self, q: _Query, i: int) -> dict[str, Any]:
        """The node's input values; inputs from skipped producers are left out (as in
        `ops.gather_inputs`)."""
        gathered: dict[str, Any] = {}
        outputs = q.outputs
        for src, src_port, port, select in q.plan.producers[i]:
            produced = outputs[src]
            if produced is not None and src_port in produced:
                value = produced[src_port]
                gathered[port] = select.apply(value) if select is not None else value
        return gathered

    def _missing_input(self, q: _Query, i: int) -> GraphError:
        name = q.plan.nodes[i].config["name"]
        return GraphError(f"query input {name!r} is missing (graph {q.plan.graph.name!r} needs it)")

    def _end(self, q: _Query, now: float, cause: str, error: BaseException | None) -> list[GraphAction]:
        """Forget a failed or cancelled query; its dispatched nodes are to be cancelled."""
        del self._queries[q.query_id]
        in_flight = tuple(q.in_flight)
        for i in in_flight:
            self._move(q, i, (_R, _X), _C, now, cause)
        actions: list[GraphAction] = []
        if error is not None:
            actions.append(QueryFailed(query_id=q.query_id, error=error))
        if in_flight:
            actions.append(CancelNodes(query_id=q.query_id, node_ids=tuple(q.plan.ids[i] for i in in_flight)))
        return actions
