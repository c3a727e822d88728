"""The store's reads and writes: rows upserted in chunks, and every query vector of a batch
answered by one top-k statement (see `teola_adapters.pgvector.engine` for why)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from teola_core.ir.types import Document

Search = tuple[int, str, Any, int]  # call index, collection, query vectors (matrix), top_k


def doc_id(text: str) -> str:
    """A document's id: a hash of its text, so equal texts are one row of a collection."""
    return "d" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def upsert_rows(
    sa: Any, conn: Any, table: str, collection: str, texts: list[str], vectors: Any, chunk_rows: int
) -> None:
    """Write a collection's texts and vectors, `chunk_rows` rows a statement; a text that is
    there already is replaced."""
    rows: dict[str, tuple[str, Any]] = {}
    for text, vector in zip(texts, vectors, strict=True):
        rows[doc_id(text)] = (text, vector)  # one row per text (the last vector wins)
    ids = list(rows)
    dim = int(vectors.shape[1]) if len(vectors) else 0
    statement = sa.text(
        f"INSERT INTO {table} (collection, id, dim, text, embedding) "
        f"SELECT :collection, u.id, {dim}, u.text, u.embedding "
        "FROM unnest(CAST(:ids AS text[]), CAST(:texts AS text[]), CAST(:embeddings AS vector[])) "
        "AS u(id, text, embedding) "
        "ON CONFLICT (collection, id) DO UPDATE SET text = EXCLUDED.text, dim = EXCLUDED.dim, "
        "embedding = EXCLUDED.embedding"
    )
    for start in range(0, len(ids), chunk_rows):
        chunk = ids[start : start + chunk_rows]
        conn.execute(
            statement,
            {
                "collection": collection,
                "ids": chunk,
                "texts": [rows[k][0] for k in chunk],
                "embeddings": [rows[k][1] for k in chunk],
            },
        )


@dataclass(frozen=True)
class SearchQuery:
    """One statement answering every query vector of a batch's searches."""

    sql: str
    params: dict[str, Any]
    collections: list[str]  # per query vector: the collection it searches


def search_query(table: str, searches: Sequence[Search]) -> SearchQuery:
    """`unnest` of the query vectors (grouped by dimension) `CROSS JOIN LATERAL` a top-k
    subquery each, ordered by (cosine distance, id); a row says if the collection exists."""
    # One row per query vector: (position, collection, k, vector), grouped by dimension.
    by_dim: dict[int, list[tuple[int, str, int, Any]]] = {}
    collections: list[str] = []
    for _, collection, matrix, top_k in searches:
        for vector in matrix:
            by_dim.setdefault(len(vector), []).append((len(collections), collection, top_k, vector))
            collections.append(collection)
    parts, params = [], {}
    for n, (dim, queries) in enumerate(sorted(by_dim.items())):
        parts.append(
            f"SELECT q.qi, EXISTS (SELECT 1 FROM {table} c WHERE c.collection = q.coll) AS known, "
            "h.id, h.text, h.metadata, h.distance "
            f"FROM unnest(CAST(:qi{n} AS integer[]), CAST(:coll{n} AS text[]), CAST(:k{n} AS integer[]), "
            f"CAST(:vec{n} AS vector[])) AS q(qi, coll, k, vec) "
            "LEFT JOIN LATERAL ("
            f"SELECT d.id, d.text, d.metadata, (d.embedding::vector({dim})) <=> q.vec::vector({dim}) AS distance "
            f"FROM {table} d WHERE d.dim = {dim} AND d.collection = q.coll "
            "ORDER BY distance, d.id LIMIT q.k) h ON true"
        )
        params |= {
            f"qi{n}": [q[0] for q in queries],
            f"coll{n}": [q[1] for q in queries],
            f"k{n}": [q[2] for q in queries],
            f"vec{n}": [q[3] for q in queries],
        }
    return SearchQuery(" UNION ALL ".join(parts) + " ORDER BY 1, 6, 3", params, collections)


def search_hits(
    searches: Sequence[Search], query: SearchQuery, rows: Sequence[Any]
) -> list[tuple[int, str, list[list[Document]] | None]]:
    """Per search call: (its index, its collection, its hits per query vector), hits None
    when its collection does not exist. Metadata carries `distance` and `collection`."""
    hits: list[list[Document]] = [[] for _ in query.collections]
    known = [True] * len(query.collections)
    for row in rows:
        known[row.qi] = bool(row.known)
        if row.id is not None:
            metadata = {
                **(row.metadata or {}),
                "distance": float(row.distance),
                "collection": query.collections[row.qi],
            }
            hits[row.qi].append(Document(row.id, row.text, metadata))
    out: list[tuple[int, str, list[list[Document]] | None]] = []
    position = 0
    for i, collection, matrix, _ in searches:
        mine = range(position, position + len(matrix))
        position += len(matrix)
        out.append((i, collection, [hits[p] for p in mine] if all(known[p] for p in mine) else None))
    return out
