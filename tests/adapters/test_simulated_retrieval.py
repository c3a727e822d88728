"""Simulated embedder, vector DB and reranker: deterministic across splits, profile-timed."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from teola_adapters.simulated import SimEmbedder, SimReranker, SimVectorDB, run_virtual
from teola_adapters.simulated.paper_profiles import EMBEDDER, RERANKER, VECTORDB
from teola_adapters.simulated.vectordb import doc_id
from teola_core.engines.protocol import Call
from teola_core.ir.kinds import MergeMode, PrimitiveKind, spec_of
from teola_core.ir.node import Node
from teola_core.ir.types import Document, Scored
from teola_core.runtime.engine_free import aggregate

TEXTS = [f"chunk {i} about {'rivers and oceans' if i % 3 else 'kernels and threads'} number {i % 7}" for i in range(48)]


def node(kind: PrimitiveKind, **config: Any) -> Node:
    spec = spec_of(kind)
    assert spec.inputs is not None and spec.outputs is not None
    return Node(kind.value, kind, spec.inputs, spec.outputs, engine="e", config=config, caps=spec.caps)


def embed_call(texts: list[str], q: str = "q") -> Call:
    return Call(q, node(PrimitiveKind.EMBED), {"texts": texts})


def ok(result: Any) -> Any:
    assert not isinstance(result, BaseException), result
    return result


def test_embedding_is_the_same_in_one_batch_or_in_stages() -> None:
    async def main() -> tuple[list[Any], list[Any], list[Any]]:
        e = SimEmbedder(EMBEDDER, time_scale=0)
        whole = (await e.run_one(embed_call(TEXTS)))["vectors"]
        staged = [v for i in range(0, 48, 16) for v in (await e.run_one(embed_call(TEXTS[i : i + 16])))["vectors"]]
        batched = await e.run([embed_call(TEXTS[:10]), embed_call(TEXTS[10:])])
        return whole, staged, [v for r in batched for v in ok(r)["vectors"]]

    whole, staged, batched = asyncio.run(main())
    assert whole == staged == batched
    assert all(len(v) == 64 and math.isclose(sum(x * x for x in v), 1.0) for v in whole)


def test_texts_sharing_words_are_more_similar() -> None:
    e = SimEmbedder(EMBEDDER, time_scale=0)

    def cos(a: str, b: str) -> float:
        return sum(x * y for x, y in zip(e.embed(a), e.embed(b), strict=True))

    assert cos("rivers flow into the ocean", "the ocean and rivers") > cos(
        "rivers flow into the ocean", "kernel thread"
    )
    assert e.embed("") == e.embed("")  # still a unit vector
    assert math.isclose(sum(x * x for x in e.embed("")), 1.0)


def test_embed_batch_costs_one_profile_latency_over_its_items() -> None:
    """DESIGN.md: 48 chunks at batch 4 take 1.8 s, at batch 16 1.35 s (simulated seconds)."""

    async def total(batch: int) -> float:
        e = SimEmbedder(EMBEDDER, time_scale=0)
        for i in range(0, 48, batch):
            await e.run_one(embed_call(TEXTS[i : i + batch]))
        return e.stats.busy_s

    assert asyncio.run(total(4)) == pytest.approx(1.8)
    assert asyncio.run(total(16)) == pytest.approx(1.35)

    async def one_batch_of_three_calls() -> SimEmbedder:
        e = SimEmbedder(EMBEDDER, time_scale=0)
        await e.run([embed_call(TEXTS[:4]), embed_call(TEXTS[4:8]), embed_call(TEXTS[8:16])])
        return e

    e = asyncio.run(one_batch_of_three_calls())
    assert (e.stats.batches, e.stats.calls, e.stats.items) == (1, 3, 16)
    assert e.stats.busy_s == pytest.approx(0.45)


async def _index(db: SimVectorDB, e: SimEmbedder, parts: list[list[str]], name: str) -> str:
    index = ""
    for part in parts:
        vectors = (await e.run_one(embed_call(part)))["vectors"]
        ingest = node(PrimitiveKind.INGEST, collection=name)
        index = (await db.run_one(Call("q", ingest, {"texts": part, "vectors": vectors})))["index"]
    return index


def test_ingest_in_stages_gives_the_same_collection_and_hits() -> None:
    queries = ["rivers and oceans number 3", "kernels threads", "chunk 5"]

    async def main() -> tuple[Any, ...]:
        e = SimEmbedder(EMBEDDER, time_scale=0)
        db = SimVectorDB(VECTORDB, time_scale=0)
        whole = await _index(db, e, [TEXTS], "whole")
        staged = await _index(db, e, [TEXTS[32:], TEXTS[:16], TEXTS[16:32], TEXTS[:5]], "staged")  # any order, twice
        qv = (await e.run_one(embed_call(queries)))["vectors"]
        search = node(PrimitiveKind.SEARCH, top_k=4)
        a = (await db.run_one(Call("q", search, {"vectors": qv, "index": whole})))["hits"]
        b = (await db.run_one(Call("q", search, {"vectors": qv, "index": staged})))["hits"]
        split = [(await db.run_one(Call("q", search, {"vectors": [v], "index": staged})))["hits"][0] for v in qv]
        return db, whole, staged, a, b, split, qv

    db, whole, staged, a, b, split, qv = asyncio.run(main())
    assert (whole, staged) == ("whole", "staged")
    assert db.collection("whole") == db.collection("staged") and len(db.collection("whole")) == 48
    assert a == b == split
    assert all(len(h) == 4 for h in a)
    assert a[2][0].text.startswith("chunk 5 ")  # retrieval is meaningful
    assert all(d.id == doc_id(d.text) for h in a for d in h)
    e = SimEmbedder(EMBEDDER, time_scale=0)
    for query_vec, hits in zip(qv, a, strict=True):
        scores = [sum(x * y for x, y in zip(query_vec, e.embed(d.text), strict=True)) for d in hits]
        assert scores == sorted(scores, reverse=True)


def test_search_ties_break_by_document_id_and_errors_stay_per_call() -> None:
    async def main() -> list[Any]:
        db = SimVectorDB(VECTORDB, time_scale=0)
        same = [1.0, 0.0]
        await db.run_one(
            Call("q7", node(PrimitiveKind.INGEST), {"texts": ["b", "a", "c"], "vectors": [same, same, [0.0, 1.0]]})
        )
        search = node(PrimitiveKind.SEARCH, top_k=2)
        return await db.run(
            [
                Call("q7", search, {"vectors": [same], "index": "q7"}),  # ingest without collection: the query's own
                Call("q7", search, {"vectors": [same], "index": "missing"}),
            ]
        )

    good, bad = asyncio.run(main())
    assert [d.text for d in ok(good)["hits"][0]] == [
        d.text for d in sorted([Document(doc_id(t), t) for t in "ab"], key=lambda d: d.id)
    ]
    assert isinstance(bad, KeyError) and "missing" in str(bad)


def test_rerank_split_then_topk_merge_equals_unsplit() -> None:
    query = "rivers and oceans number 3"
    docs = [Document(doc_id(t), t) for t in TEXTS] + [Document("dup", TEXTS[10])]  # ties with TEXTS[10]

    async def main() -> tuple[list[Scored], list[list[Scored]]]:
        r = SimReranker(RERANKER, time_scale=0)
        rerank = node(PrimitiveKind.RERANK, top_k=5)
        unsplit = (await r.run_one(Call("q", rerank, {"query": query, "docs": docs})))["docs"]
        results = await r.run([Call("q", rerank, {"query": query, "docs": docs[i : i + 16]}) for i in range(0, 49, 16)])
        return unsplit, [ok(x)["docs"] for x in results]

    unsplit, stages = asyncio.run(main())
    assert len(unsplit) == 5 and [s.score for s in unsplit] == sorted((s.score for s in unsplit), reverse=True)
    assert aggregate(MergeMode.TOPK, stages, 5) == unsplit
    assert all("rivers and oceans number 3" in s.doc.text for s in unsplit)
    tied = [s.doc.id for s in unsplit if s.doc.text == TEXTS[10]]
    assert tied == [doc_id(TEXTS[10]), "dup"]  # equal scores keep input order


def test_time_scale_zero_is_instant_and_positive_scale_waits() -> None:
    async def run(scale: float) -> float:
        loop = asyncio.get_running_loop()  # virtual time: what the engine waits, exactly
        e = SimEmbedder(EMBEDDER, time_scale=scale)
        began = loop.time()
        await asyncio.gather(e.run_one(embed_call(TEXTS[:16])), e.run_one(embed_call(TEXTS[16:32])))
        return loop.time() - began

    assert run_virtual(run(0)) == 0.0  # no timed wait at all
    # One instance: the two batches of 0.45 s (x 0.02 = 9 ms) run one after the other.
    assert run_virtual(run(0.02)) == pytest.approx(2 * 0.45 * 0.02)


def test_wrong_kinds_and_inputs_fail_their_call_only() -> None:
    async def main() -> list[Any]:
        e = SimEmbedder(EMBEDDER, time_scale=0)
        return await e.run([embed_call(["x"]), Call("q", node(PrimitiveKind.RERANK), {}), embed_call("not a list")])  # type: ignore[arg-type]

    good, wrong_kind, bad_input = asyncio.run(main())
    assert len(ok(good)["vectors"]) == 1
    assert isinstance(wrong_kind, TypeError) and isinstance(bad_input, TypeError)
    with pytest.raises(ValueError, match="time_scale"):
        SimEmbedder(EMBEDDER, time_scale=-1)
    with pytest.raises(KeyError, match="embed"):
        SimEmbedder(RERANKER)
