"""The store's schema: the pgvector extension, the one table of all collections, and an HNSW
cosine index per vector dimension (see `teola_adapters.pgvector.engine` for the layout).

Every change takes one advisory lock, so processes sharing a database create each thing once.
"""

from __future__ import annotations

from typing import Any

_SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(hashtext('teola-pgvector-schema'))"


def create_extension(db: Any) -> None:
    """`CREATE EXTENSION vector` unless it exists (`db`: a SQLAlchemy engine)."""
    with db.begin() as conn:
        conn.exec_driver_sql(_SCHEMA_LOCK)
        conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS vector")


def create_table(db: Any, table: str) -> None:
    """The table of all collections, unless it exists."""
    with db.begin() as conn:
        conn.exec_driver_sql(_SCHEMA_LOCK)
        conn.exec_driver_sql(
            f"CREATE TABLE IF NOT EXISTS {table} ("
            "collection text NOT NULL, id text NOT NULL, dim integer NOT NULL, text text NOT NULL, "
            "metadata jsonb NOT NULL DEFAULT '{}'::jsonb, embedding vector NOT NULL, "
            "PRIMARY KEY (collection, id))"
        )


def create_hnsw_index(db: Any, table: str, dim: int, m: int, ef_construction: int) -> None:
    """The HNSW cosine index of one dimension, a partial expression index, unless it exists."""
    with db.begin() as conn:
        conn.exec_driver_sql(_SCHEMA_LOCK)
        conn.exec_driver_sql(
            f"CREATE INDEX IF NOT EXISTS {table}_hnsw_{dim} ON {table} USING hnsw "
            f"((embedding::vector({dim})) vector_cosine_ops) "
            f"WITH (m = {int(m)}, ef_construction = {int(ef_construction)}) WHERE dim = {dim}"
        )
