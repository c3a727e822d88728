"""Postgres + pgvector vector store (embedded Postgres by default).

store = PgVectorStore()                              # DATABASE_URL, else embedded ("teola[pgvector]")
store = PgVectorStore("postgresql://user:pw@host/db")
"""

from teola_adapters.pgvector.engine import (
    PgVectorError,
    PgVectorStore,
    default_pgdata,
    doc_id,
    sqlalchemy_url,
)
from teola_adapters.pgvector.profiling import measure_profile

__all__ = ["PgVectorError", "PgVectorStore", "default_pgdata", "doc_id", "measure_profile", "sqlalchemy_url"]
