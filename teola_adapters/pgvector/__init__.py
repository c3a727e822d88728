"""Postgres + pgvector vector store (embedded Postgres by default).

store = PgVectorStore()                              # DATABASE_URL, else embedded ("teola[pgvector]")
store = PgVectorStore("postgresql://user:pw@host/db")

Modules: `engine` (the store), `statements` (its reads and writes), `schema`, `location`
(where the database is), `errors`, `embedded` and `watchdog` (the embedded server),
`profiling`.
"""

from teola_adapters.pgvector.engine import PgVectorStore
from teola_adapters.pgvector.errors import PgVectorError
from teola_adapters.pgvector.location import default_pgdata, sqlalchemy_url
from teola_adapters.pgvector.profiling import measure_profile
from teola_adapters.pgvector.statements import doc_id

__all__ = ["PgVectorError", "PgVectorStore", "default_pgdata", "doc_id", "measure_profile", "sqlalchemy_url"]
