"""Engine scheduler and policies: events in, exact batches out (no engines, no clock)."""

from __future__ import annotations

import pytest

from teola_core.engines.protocol import Engine, EngineLimits
from teola_core.ir.kinds import Capabilities, PortSpec, PrimitiveKind, spec_of
from teola_core.ir.node import Node
from teola_core.ir.types import PortType
from teola_core.profiles.profile import Curve, LatencyProfile
from teola_core.scheduler.engine_scheduler import EngineScheduler
from teola_core.scheduler.events import (
    BatchFinished,
    CancelBatch,
    ConcurrencyChanged,
    Dispatch,
    NodeReady,
    QueryCancelRequested,
    RunBatch,
    SchedulerError,
)
from teola_core.scheduler.policies import POLICIES, make_policy

_EMBED = spec_of(PrimitiveKind.EMBED)


def _node(node_id: str, *, batchable: bool = True) -> Node:
    caps = _EMBED.caps if batchable else _EMBED.caps.narrowed(batchable=False)
    return Node(node_id, PrimitiveKind.EMBED, _EMBED.inputs or (), _EMBED.outputs or (), engine="emb", caps=caps)


def _ready(
    qid: str,
    node_id: str,
    *,
    depth: float = 1.0,
    arrival: float = 0.0,
    items: int = 1,
    stream: bool = False,
    batchable: bool = True,
) -> NodeReady:
    return NodeReady(
        query_id=qid,
        node=_node(node_id, batchable=batchable),
        inputs={"texts": ["t"] * items},
        depth=depth,
        arrival=arrival,
        items=items,
        now=0.0,
        stream=stream,
    )


def _names(batch: RunBatch) -> list[str]:
    return [f"{c.query_id}.{c.node.id}" for c in batch.calls]


def _drain(es: EngineScheduler, *events: NodeReady) -> list[list[str]]:
    """Feed events with the engine busy, then let it run batch after batch."""
    busy = es.handle(_ready("busy", "x"))  # occupy the only slot so everything queues
    assert len(busy) == 1
    batches = es.handle(*events)
    assert batches == []
    out: list[list[str]] = []
    finished = busy[0].batch_id
    while True:
        [*started] = es.handle(BatchFinished(batch_id=finished, now=0.0))
        if not started:
            return out
        (batch,) = started
        out.append(_names(batch))
        finished = batch.batch_id


# Three queries; q1 arrived first. Depth = longest path to the output.
_MIXED = (
    _ready("q2", "a", depth=1, arrival=2.0),
    _ready("q1", "a", depth=1, arrival=1.0),
    _ready("q3", "a", depth=5, arrival=3.0),
    _ready("q1", "b", depth=3, arrival=1.0),
    _ready("q2", "b", depth=4, arrival=2.0),
    _ready("q1", "c", depth=3, arrival=1.0),
)


def test_topology_buckets_by_query_arrival_deepest_first_and_fills_the_max_batch() -> None:
    es = EngineScheduler("emb", policy="topology", max_batch_items=4)
    assert _drain(es, *_MIXED) == [["q1.b", "q1.c", "q1.a", "q2.b"], ["q2.a", "q3.a"]]


def test_fifo_keeps_arrival_order_of_nodes() -> None:
    es = EngineScheduler("emb", policy="fifo", max_batch_items=4)
    assert _drain(es, *_MIXED) == [["q2.a", "q1.a", "q3.a", "q1.b"], ["q2.b", "q1.c"]]


def test_po_runs_one_invocation_per_batch_in_arrival_order() -> None:
    # Nodes of one query's module form one invocation, whatever the max batch; nothing
    # of another invocation joins it.
    es = EngineScheduler("emb", policy="po", max_batch_items=2)
    assert _drain(es, *_MIXED) == [["q2.a", "q2.b"], ["q1.a", "q1.b", "q1.c"], ["q3.a"]]


def test_po_separates_modules_of_one_query() -> None:
    es = EngineScheduler("emb", policy="po")
    first = _ready("q1", "a")
    other_module = NodeReady(
        query_id="q1",
        node=Node(
            "b",
            PrimitiveKind.EMBED,
            _EMBED.inputs or (),
            _EMBED.outputs or (),
            engine="emb",
            caps=_EMBED.caps,
            module="retrieval",
        ),
        inputs={"texts": ["t"]},
        depth=1.0,
        arrival=0.0,
        items=1,
        now=0.0,
    )
    assert _drain(es, first, other_module) == [["q1.a"], ["q1.b"]]


def test_po_runs_one_invocation_per_instance_whatever_the_concurrency() -> None:
    es = EngineScheduler("llm", policy="po", concurrency=64, instances=2)
    started = es.handle(_ready("q1", "a"), _ready("q2", "a"), _ready("q3", "a"))
    assert [_names(b) for b in started] == [["q1.a"], ["q2.a"]]
    assert es.pending == 1


def test_to_fills_its_fixed_max_batch_whatever_the_engine_max() -> None:
    es = EngineScheduler("emb", policy=make_policy("to", max_batch=5), max_batch_items=2)
    assert _drain(es, *_MIXED) == [["q2.a", "q1.a", "q3.a", "q1.b", "q2.b"], ["q1.c"]]
    # Without a fixed size it falls back to the engine scheduler's max batch.
    es = EngineScheduler("emb", policy="to", max_batch_items=2)
    assert _drain(es, *_MIXED) == [["q2.a", "q1.a"], ["q3.a", "q1.b"], ["q2.b", "q1.c"]]


def test_unbounded_max_batch_takes_everything_pending() -> None:
    es = EngineScheduler("emb", policy="topology", max_batch_items=None)
    assert _drain(es, *_MIXED) == [["q1.b", "q1.c", "q1.a", "q2.b", "q2.a", "q3.a"]]


def test_batches_count_items_first_fit_and_a_node_larger_than_the_max_runs_alone() -> None:
    es = EngineScheduler("emb", policy="topology", max_batch_items=8)
    events = (
        _ready("q1", "big", depth=9, items=20, arrival=1.0),  # larger than the max: alone
        _ready("q1", "six", depth=5, items=6, arrival=1.0),
        _ready("q2", "five", depth=5, items=5, arrival=2.0),  # does not fit after six
        _ready("q2", "two", depth=1, items=2, arrival=2.0),  # fits: first fit
        _ready("q3", "one", depth=1, items=1, arrival=3.0),
    )
    assert _drain(es, *events) == [["q1.big"], ["q1.six", "q2.two"], ["q2.five", "q3.one"]]


def test_streams_and_unbatchable_nodes_run_alone() -> None:
    es = EngineScheduler("emb", policy="fifo", max_batch_items=8)
    events = (
        _ready("q1", "a"),
        _ready("q1", "stream", stream=True),
        _ready("q2", "solo", batchable=False),
        _ready("q2", "b"),
    )
    assert _drain(es, *events) == [["q1.a", "q2.b"], ["q1.stream"], ["q2.solo"]]
    es = EngineScheduler("emb", policy="fifo", max_batch_items=8)
    [batch] = es.handle(_ready("q1", "stream", stream=True), _ready("q1", "a"))
    assert batch.stream and _names(batch) == ["q1.stream"]


def test_several_events_at_once_share_one_batch() -> None:
    es = EngineScheduler("emb", policy="topology", max_batch_items=16)
    [batch] = es.handle(_ready("q1", "a"), _ready("q2", "a"), _ready("q3", "a"))
    assert batch == RunBatch(engine="emb", batch_id=0, calls=batch.calls)
    assert _names(batch) == ["q1.a", "q2.a", "q3.a"] and batch.items == 3


def test_concurrency_limits_batches_in_flight() -> None:
    es = EngineScheduler("emb", policy="fifo", max_batch_items=1, concurrency=2)
    first = es.handle(_ready("q1", "a"), _ready("q2", "a"), _ready("q3", "a"))
    assert [(b.batch_id, _names(b)) for b in first] == [(0, ["q1.a"]), (1, ["q2.a"])]
    assert es.pending == 1 and len(es.running) == 2
    [third] = es.handle(BatchFinished(batch_id=1, now=1.0))
    assert (third.batch_id, _names(third)) == (2, ["q3.a"])
    assert es.handle(BatchFinished(batch_id=0, now=2.0)) == []
    assert es.pending == 0 and len(es.running) == 1


def test_a_changed_concurrency_starts_waiting_batches_and_never_stops_running_ones() -> None:
    es = EngineScheduler("emb", policy="fifo", max_batch_items=1, concurrency=1)
    [first] = es.handle(_ready("q1", "a"), _ready("q2", "a"), _ready("q3", "a"), _ready("q4", "a"))
    grown = es.handle(ConcurrencyChanged(concurrency=3))
    assert [_names(b) for b in grown] == [["q2.a"], ["q3.a"]] and es.pending == 1
    assert es.handle(ConcurrencyChanged(concurrency=1)) == [] and len(es.running) == 3
    assert es.handle(BatchFinished(batch_id=first.batch_id, now=1.0)) == []  # still 2 running > 1
    assert es.handle(BatchFinished(batch_id=grown[0].batch_id, now=2.0)) == []
    [last] = es.handle(BatchFinished(batch_id=grown[1].batch_id, now=3.0))
    assert _names(last) == ["q4.a"]
    with pytest.raises(SchedulerError, match="concurrency must be >= 1, got 0"):
        es.handle(ConcurrencyChanged(concurrency=0))


def test_cancel_drops_a_querys_pending_nodes_only() -> None:
    for policy in POLICIES:
        es = EngineScheduler("emb", policy=policy, max_batch_items=8)
        [busy] = es.handle(_ready("busy", "x"))
        es.handle(_ready("q1", "a"), _ready("q2", "a"), _ready("q1", "b"))
        assert es.handle(QueryCancelRequested(query_id="q1", now=1.0)) == []
        assert es.handle(QueryCancelRequested(query_id="nobody", now=1.0)) == []
        assert es.pending == 1
        [batch] = es.handle(BatchFinished(batch_id=busy.batch_id, now=2.0))
        assert _names(batch) == ["q2.a"], policy


def test_topology_bucket_order_survives_a_bucket_emptying_and_refilling() -> None:
    es = EngineScheduler("emb", policy="topology", max_batch_items=1)
    [busy] = es.handle(_ready("busy", "x"))
    es.handle(_ready("q2", "a", arrival=2.0), _ready("q1", "a", arrival=1.0))
    [b1] = es.handle(BatchFinished(batch_id=busy.batch_id, now=0.0))
    assert _names(b1) == ["q1.a"]
    es.handle(_ready("q1", "b", arrival=1.0))  # q1 is back, and still first
    [b2] = es.handle(BatchFinished(batch_id=b1.batch_id, now=0.0))
    assert _names(b2) == ["q1.b"]


def test_node_ready_from_dispatch_counts_items_like_call_items() -> None:
    node = _node("e")
    d = Dispatch(query_id="q", node=node, inputs={"texts": ["a", "b", "c"]}, depth=2.0, arrival=1.0)
    ready = NodeReady.from_dispatch(d, now=4.0)
    assert (ready.items, ready.depth, ready.arrival, ready.now, ready.stream) == (3, 2.0, 1.0, 4.0, False)
    llm = Node("p", PrimitiveKind.PREFILL, (PortSpec("prompt", PortType.PROMPT),), (), "llm", caps=Capabilities(True))
    prefill = Dispatch(query_id="q", node=llm, inputs={"prompt": "x"}, depth=1, arrival=0)
    assert NodeReady.from_dispatch(prefill, 0).items == 1


def test_errors_name_what_is_wrong() -> None:
    es = EngineScheduler("emb")
    with pytest.raises(SchedulerError, match="batch 7 is not running"):
        es.handle(BatchFinished(batch_id=7, now=0.0))
    with pytest.raises(ValueError, match=r"unknown scheduling policy 'lifo' \(known: topology, fifo, po, to\)"):
        make_policy("lifo")
    with pytest.raises(ValueError, match="only 'to' has a fixed max batch"):
        make_policy("fifo", max_batch=3)
    with pytest.raises(ValueError, match="concurrency must be at least 1"):
        EngineScheduler("emb", concurrency=0)


def test_a_cancelled_query_cancels_the_batches_only_it_still_needs() -> None:
    es = EngineScheduler("emb", policy="fifo", max_batch_items=2, concurrency=2)
    shared, alone = es.handle(_ready("q1", "a"), _ready("q2", "a"), _ready("q1", "b"))
    assert (_names(shared), _names(alone)) == (["q1.a", "q2.a"], ["q1.b"])
    assert es.handle(QueryCancelRequested(query_id="q1", now=1.0)) == [CancelBatch(engine="emb", batch_id=1)]
    assert es.handle(QueryCancelRequested(query_id="q2", now=1.0)) == [CancelBatch(engine="emb", batch_id=0)]
    assert es.handle(QueryCancelRequested(query_id="q2", now=1.0)) == []  # once only
    assert len(es.running) == 2  # a cancelled batch holds its slot until its end is reported
    [next_one] = es.handle(_ready("q3", "a"), BatchFinished(batch_id=1, now=2.0))
    assert _names(next_one) == ["q3.a"]
    es.handle(BatchFinished(batch_id=0, now=2.0), BatchFinished(batch_id=next_one.batch_id, now=2.0))
    assert es.running == () and es.pending == 0


def test_for_engine_takes_the_max_batch_from_the_profile_limits_or_override() -> None:
    class Emb(Engine):
        name = "emb"
        kinds = frozenset({PrimitiveKind.EMBED})

        async def run(self, calls):  # type: ignore[no-untyped-def]
            return []

    emb = Emb()
    emb.profile = LatencyProfile("emb", {"embed": Curve(((1, 0.1), (4, 0.15), (16, 0.45), (32, 0.9)))})
    emb.limits = EngineLimits(concurrency=3, max_batch_items=8)
    es = EngineScheduler.for_engine("emb", emb, policy="fifo")
    assert (es.max_batch_items, es.concurrency, es.policy.name) == (8, 3, "fifo")
    assert EngineScheduler.for_engine("emb", emb, max_batch={"emb": None}).max_batch_items == 8
    assert EngineScheduler.for_engine("emb", emb, max_batch={"emb": 2}).max_batch_items == 2
    assert EngineScheduler.for_engine("emb", emb, max_batch={"other": 2}).max_batch_items == 8
    assert EngineScheduler.for_engine("emb", emb, policy="to", to_max_batch=5).policy.limit(None) == 5


# -- topology with the engine's batch cost (the paper's embedder: flat throughput past 16) ----
def _embedder_cost(items: int) -> float:
    from teola_adapters.simulated.paper_profiles import EMBEDDER

    return EMBEDDER.latency("embed", items)


def _costed(**kw: object) -> EngineScheduler:
    return EngineScheduler("emb", policy="topology", max_batch_items=16, batch_cost=_embedder_cost, **kw)  # type: ignore[arg-type]


def test_a_querys_small_node_rides_along_with_its_large_one() -> None:
    chunks, question = _ready("q1", "chunks", depth=3, items=48), _ready("q1", "question", depth=2, items=1)
    assert _drain(_costed(), chunks, question) == [["q1.chunks", "q1.question"]]  # 1.35 s, not 1.32 + 0.10
    by_size = EngineScheduler("emb", policy="topology", max_batch_items=16)
    assert _drain(by_size, chunks, question) == [["q1.chunks"], ["q1.question"]]


def test_two_queries_mid_size_nodes_share_a_batch_only_when_others_wait() -> None:
    a, b = _ready("qa", "x", arrival=1.0, items=8), _ready("qb", "x", arrival=2.0, items=8)
    # alone: qa in 0.27 s, qb 0.27 s later (sum 0.81) beats both in 0.45 s (sum 0.90)
    assert _drain(_costed(), a, b) == [["qa.x"], ["qb.x"]]
    waiting = [_ready(f"q{i}", "x", arrival=3.0 + i, items=48) for i in range(2)]
    # with two queries waiting behind, the 0.09 s of engine time saved counts three times
    assert _drain(_costed(), a, b, *waiting)[0] == ["qa.x", "qb.x"]


def test_a_query_whose_most_advancing_node_cannot_join_adds_none_of_the_others() -> None:
    lead = _ready("q1", "late", arrival=1.0, items=1)
    chunks, question = _ready("q2", "chunks", depth=3, arrival=2.0, items=48), _ready("q2", "q", depth=2, arrival=2.0)
    other = _ready("q3", "q", arrival=3.0, items=1)
    # q2's question would finish early only to wait for its chunks: it rides along with them later
    assert _drain(_costed(), lead, chunks, question, other) == [["q1.late", "q3.q"], ["q2.chunks", "q2.q"]]


def test_an_infinite_cost_past_a_hard_limit_caps_the_batch() -> None:
    capped = EngineScheduler("emb", policy="topology", batch_cost=lambda n: float("inf") if n > 2 else 0.1 * n**0.5)
    nodes = [_ready(f"q{i}", "x", arrival=float(i)) for i in range(5)]
    assert [len(b) for b in _drain(capped, *nodes)] == [2, 2, 1]


def test_fifo_po_and_to_ignore_the_cost() -> None:
    chunks, question = _ready("q1", "chunks", items=48), _ready("q1", "question", items=1)
    for policy in ("fifo", "to"):
        es = EngineScheduler("emb", policy=policy, max_batch_items=16, batch_cost=_embedder_cost)
        assert _drain(es, chunks, question) == [["q1.chunks"], ["q1.question"]]
