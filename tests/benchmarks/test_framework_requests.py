"""The baselines' framework requests: LlamaIndex-sized embed requests, one after another."""

from __future__ import annotations

import asyncio
from itertools import pairwise

import pytest

from teola_adapters.simulated.paper_profiles import paper_engines
from teola_benchmarks.framework_requests import FrameworkRequests
from teola_benchmarks.workloads import WORKLOADS
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.validate import validate
from teola_core.passes.base import PassContext
from teola_core.runtime.reference import evaluate


def _graph_and_query(workload: str = "naive_rag"):
    w = WORKLOADS[workload]
    query = w.make_query(0)
    return w.template(1.0).instantiate(query), query, w


def test_a_48_text_embed_becomes_five_chained_requests() -> None:
    graph, _, _ = _graph_and_query()
    out = FrameworkRequests(10).run(graph, PassContext())
    validate(out)
    chunks = [n for n in out.nodes.values() if n.kind == PrimitiveKind.EMBED and n.module == "indexing"]
    assert [n.items for n in chunks] == [10, 10, 10, 10, 8]
    chain = {(c.src, c.dst) for c in out.control_edges if c.pinned}
    assert all((a.id, b.id) in chain for a, b in pairwise(chunks))
    assert FrameworkRequests(10).run(out, PassContext()) is out  # nothing left to cut: the fixed point


def test_gathered_requests_go_out_together() -> None:
    graph, _, _ = _graph_and_query()
    out = FrameworkRequests(10, gathered=True).run(graph, PassContext())
    validate(out)
    chunks = [n for n in out.nodes.values() if n.kind == PrimitiveKind.EMBED and n.module == "indexing"]
    assert [n.items for n in chunks] == [10, 10, 10, 10, 8]
    assert not any(c.pinned for c in out.control_edges)
    assert FrameworkRequests(10, gathered=True).run(out, PassContext()) is out


def test_small_embeds_are_left_alone_and_sizes_are_checked() -> None:
    graph, _, _ = _graph_and_query()
    assert FrameworkRequests(64).run(graph, PassContext()) is graph
    with pytest.raises(ValueError, match="request_items"):
        FrameworkRequests(0)


def test_requests_compute_what_the_whole_embed_computes() -> None:
    graph, query, w = _graph_and_query("advanced_rag")
    sync = FrameworkRequests(10).run(graph, PassContext())
    gathered = FrameworkRequests(10, gathered=True).run(graph, PassContext())

    async def all_three() -> list[object]:
        engines = paper_engines(time_scale=0.0, responder=w.model)
        try:
            return [await evaluate(g, query, engines, name) for name, g in (("a", graph), ("b", sync), ("c", gathered))]
        finally:
            await engines.close()

    whole, one_by_one, together = asyncio.run(all_three())
    assert whole == one_by_one == together
