"""The graph scheduler: tracks every running query's e-graph and says which node runs next.

A pure state machine after Dask's `worker_state_machine`: `handle(event)` updates state and
returns actions (see `teola_core.scheduler.events`); no I/O, no clock, no engines. What a
graph computes is defined by `teola_core.runtime.reference`; this machine reaches the same
outputs, only as early as the dependencies allow.

Its records, per graph (`GraphPlan`) and per query (`QueryState`), are in
`teola_core.scheduler.graph_state`; this module holds the transitions, the only code that
changes them.

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
    ready   -> done      `NodeWithdrawn`: a speculative node given up unstarted settles with
                         its speculation's withdrawn outputs
    waiting -> done      a speculative node given up before it was ready settles so when
                         its sources have (never dispatched)
    *       -> cancelled      `QueryCancelRequested` (or another node failed)

Giving up (`teola_core.ir.speculation`): when a speculative node is all its consumer still
waits for, the scheduler gives it up: `WithdrawNode` if it is dispatched (its engine drops
it if not started and says so with `NodeWithdrawn`; a started one runs on), else it
settles unrun once its own sources have.

Settling a node touches only its out-edges and the inputs of the nodes it makes ready,
so an event costs O(affected nodes), whatever the size of the graph or the number of
queries. A query that ends (done, failed, cancelled) is forgotten; late events for it
(results of batches already running) are dropped.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from teola_core.ir.errors import GraphError, PrimitiveError
from teola_core.ir.graph import Graph
from teola_core.ir.node import Node
from teola_core.scheduler.events import (
    CancelNodes,
    Dispatch,
    GraphAction,
    GraphEvent,
    NodeFailed,
    NodeFinished,
    NodeStarted,
    NodeWithdrawn,
    QueryCancelRequested,
    QueryDone,
    QueryFailed,
    QuerySubmitted,
    SchedulerError,
    WithdrawNode,
)
from teola_core.scheduler.graph_state import (
    ROLE_DISPATCHED,
    ROLE_INPUT,
    GraphPlan,
    InvalidTransition,
    NodeState,
    QueryState,
    Transition,
)

_W, _R, _X, _D, _S, _F, _C = (
    NodeState.WAITING,
    NodeState.READY,
    NodeState.RUNNING,
    NodeState.DONE,
    NodeState.SKIPPED,
    NodeState.FAILED,
    NodeState.CANCELLED,
)


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
        self._queries: dict[str, QueryState] = {}
        self._plans: weakref.WeakKeyDictionary[Graph, tuple[GraphPlan, tuple[float, ...]]] = weakref.WeakKeyDictionary()

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
            elif isinstance(event, NodeWithdrawn):
                i = self._index(q, event.node_id, _D)
                self._move(q, i, (_R,), _D, event.now, "withdrawn unstarted")
                del q.in_flight[i]
                self._fill_withdrawn(q, i)
                self._settle(q, i, event.now, actions)
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
        return self._done_if_settled(q, actions)

    def _submit(self, event: QuerySubmitted) -> list[GraphAction]:
        if event.query_id in self._queries:
            raise SchedulerError(f"query {event.query_id!r} is already running")
        plan, default_depths = self._plan(event.graph)
        depths = default_depths if event.depths is None else tuple(float(event.depths.get(i, 0.0)) for i in plan.ids)
        arrival = event.now if event.arrival is None else event.arrival
        q = QueryState(event.query_id, plan, event.inputs, depths, arrival)
        # Check the inputs first, so a query with a missing one dispatches nothing.
        for i in plan.roots:
            if plan.roles[i] == ROLE_INPUT and plan.nodes[i].config["name"] not in event.inputs:
                return [QueryFailed(query_id=q.query_id, error=self._missing_input(q, i))]
        self._queries[q.query_id] = q
        actions: list[GraphAction] = []
        try:
            self._resolve(q, deque(plan.roots), event.now, actions)
        except _QueryEnded as ended:
            return actions + self._end(q, event.now, "query failed", ended.error)
        return self._done_if_settled(q, actions)

    def _done_if_settled(self, q: QueryState, actions: list[GraphAction]) -> list[GraphAction]:
        """`actions`, ending in the query's `QueryDone` (its state dropped) once every node settled."""
        if q.unsettled == 0:
            del self._queries[q.query_id]
            actions.append(QueryDone(query_id=q.query_id, outputs=q.result))
        return actions

    def _plan(self, graph: Graph) -> tuple[GraphPlan, tuple[float, ...]]:
        cached = self._plans.get(graph)
        if cached is None:
            plan = GraphPlan.of(graph)
            depth = graph.depths(self._depth_cost)
            cached = (plan, tuple(depth[i] for i in plan.ids))
            self._plans[graph] = cached
        return cached

    # -- transitions ---------------------------------------------------------------------
    def _index(self, q: QueryState, node_id: str, finish: NodeState) -> int:
        i = q.plan.index.get(node_id)
        if i is None:
            raise InvalidTransition(q.query_id, node_id, None, finish, [])
        return i

    def _move(
        self, q: QueryState, i: int, allowed: tuple[NodeState, ...], finish: NodeState, now: float, cause: str
    ) -> None:
        start = q.state[i]
        if start not in allowed:
            node_id = q.plan.ids[i]
            raise InvalidTransition(q.query_id, node_id, start, finish, [t for t in q.story if t.node_id == node_id])
        q.state[i] = finish
        q.story.append(Transition(q.plan.ids[i], start, finish, now, cause))

    def _finished(self, q: QueryState, event: NodeFinished, actions: list[GraphAction]) -> None:
        i = self._index(q, event.node_id, _D)
        self._move(q, i, (_R, _X), _D, event.now, "finished")
        del q.in_flight[i]
        q.outputs[i] = event.outputs
        self._settle(q, i, event.now, actions)

    def _settle(self, q: QueryState, first: int, now: float, actions: list[GraphAction]) -> None:
        """`first` is done or skipped: tell its dependents, resolve those now unblocked."""
        self._resolve(q, deque(), now, actions, settled=first)

    @staticmethod
    def _fill_withdrawn(q: QueryState, i: int) -> None:
        """A given-up speculative node's outputs: its speculation's withdrawn ones."""
        speculation = q.plan.speculations[i]
        assert speculation is not None
        q.outputs[i] = dict(speculation.withdrawn)

    def _give_up_if_alone(self, q: QueryState, consumer: int, actions: list[GraphAction]) -> None:
        """Give up the consumer's unsettled speculative sources once they are all it waits for
        (each feeds it by one edge, so they are the rest of its count)."""
        open_ = [s for s in q.plan.speculative_inputs[consumer] if q.state[s] in (_W, _R, _X)]
        if not open_ or q.remaining[consumer] != len(open_):
            return
        for s in open_:
            if q.given_up[s]:
                continue
            q.given_up[s] = 1
            if q.state[s] is _R:
                actions.append(WithdrawNode(query_id=q.query_id, node=q.plan.nodes[s]))

    def _resolve(
        self, q: QueryState, unblocked: deque[int], now: float, actions: list[GraphAction], settled: int | None = None
    ) -> None:
        """Settle `settled` (if given) and decide every node that becomes unblocked.

        A worklist, not recursion: a skip can cascade through a long chain.
        """
        plan, remaining, skip, state = q.plan, q.remaining, q.skip, q.state
        waits_on_speculation = plan.speculative_inputs
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
                    elif dst in waits_on_speculation:
                        self._give_up_if_alone(q, dst, actions)
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
                        elif dst in waits_on_speculation:
                            self._give_up_if_alone(q, dst, actions)
            if unblocked:
                i = unblocked.popleft()
                if skip[i]:
                    self._move(q, i, (_W,), _S, now, "skipped")
                    settled_queue.append(i)
                    continue
                if q.given_up[i]:  # a speculative node its consumer stopped waiting for
                    self._move(q, i, (_W,), _D, now, "given up before it was ready")
                    self._fill_withdrawn(q, i)
                    settled_queue.append(i)
                    continue
                role = plan.roles[i]
                if role == ROLE_DISPATCHED:
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
                elif role == ROLE_INPUT:
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

    def _gather(self, q: QueryState, i: int) -> dict[str, Any]:
        """The node's input values; inputs from skipped producers are left out (as in
        `engine_free.gather_inputs`)."""
        gathered: dict[str, Any] = {}
        outputs = q.outputs
        for src, src_port, port, select in q.plan.producers[i]:
            produced = outputs[src]
            if produced is not None and src_port in produced:
                value = produced[src_port]
                gathered[port] = select.apply(value) if select is not None else value
        return gathered

    def _missing_input(self, q: QueryState, i: int) -> GraphError:
        name = q.plan.nodes[i].config["name"]
        return GraphError(f"query input {name!r} is missing (graph {q.plan.graph.name!r} needs it)")

    def _end(self, q: QueryState, now: float, cause: str, error: BaseException | None) -> list[GraphAction]:
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
