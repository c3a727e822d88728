"""A vector store on Postgres + pgvector: INGEST (`texts`, `vectors` -> `index`), SEARCH
(`vectors`, `index` -> `hits`).

    store = PgVectorStore()          # DATABASE_URL, else an embedded Postgres with pgvector
    engines = EngineSet().add(store)

The database is the `url` given, else `DATABASE_URL`, else an embedded server in
`pgdata`. A batch that loses its connection reconnects (restarting the embedded server)
and runs once more; else each call fails with a `PgVectorError` naming its collection.
Layout, indexes, what the planner does with them, ingest and search statements:
`docs/engines.md`, "Postgres + pgvector".
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tenacity import retry, stop_after_delay, wait_exponential

from teola_adapters._optional import require
from teola_adapters._profiles import ProfileSource, load_profile
from teola_adapters.pgvector.embedded import EmbeddedPostgres
from teola_adapters.pgvector.errors import ConnectionLost, PgVectorError, first_line, is_connection_lost
from teola_adapters.pgvector.location import default_pgdata, redact, sqlalchemy_url
from teola_adapters.pgvector.schema import create_extension, create_hnsw_index, create_table
from teola_adapters.pgvector.statements import Search, search_hits, search_query, upsert_rows
from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.types import Document

_BUNDLED_PROFILE = Path(__file__).with_name("profile.json")
Ingest = tuple[int, str, list[str], Any]  # call index, collection, texts, vectors (matrix)
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")


class PgVectorStore(Engine):
    """INGEST and SEARCH on Postgres + pgvector (see the module doc).

    url: a Postgres URL (default: `DATABASE_URL`, else the embedded server in `pgdata`).
    table: the table holding all collections.
    hnsw: keep an HNSW cosine index per dimension (see the module doc for its cost).
    m, ef_construction: HNSW build parameters; ef_search: its search breadth.
    exact: exact search (no index scans).
    concurrency: batches that may run at once (each on its own pooled connection).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        pgdata: str | Path | None = None,
        name: str = "vectordb",
        table: str = "teola_documents",
        hnsw: bool = True,
        m: int = 16,
        ef_construction: int = 64,
        ef_search: int = 100,
        exact: bool = False,
        ingest_chunk_rows: int = 1000,
        concurrency: int = 2,
        profile: ProfileSource = None,
    ) -> None:
        if not _IDENTIFIER.match(table):
            raise ValueError(f"table name must be a lower-case SQL identifier, got {table!r}")
        if ingest_chunk_rows < 1:
            raise ValueError(f"ingest_chunk_rows must be >= 1, got {ingest_chunk_rows}")
        self._sa = require("sqlalchemy", "pgvector", "PgVectorStore")
        self._np = require("numpy", "pgvector", "PgVectorStore")
        register_vector = require("pgvector.psycopg", "pgvector", "PgVectorStore").register_vector
        require("psycopg", "pgvector", "PgVectorStore")
        self.name = name
        self.kinds = frozenset({PrimitiveKind.INGEST, PrimitiveKind.SEARCH})
        self.limits = EngineLimits(concurrency=concurrency)
        self.profile = load_profile(profile, name, _BUNDLED_PROFILE)
        self.table = table
        self.hnsw = hnsw
        self.m, self.ef_construction, self.ef_search, self.exact = m, ef_construction, ef_search, exact
        self.ingest_chunk_rows = ingest_chunk_rows
        self.embedded: EmbeddedPostgres | None = None
        url = url or os.environ.get("DATABASE_URL")
        if url is None:
            self.embedded = EmbeddedPostgres(Path(pgdata) if pgdata is not None else default_pgdata())
            url = self.embedded.url
        self.url = sqlalchemy_url(url)
        self.where = redact(self.url)
        sa = self._sa
        self.db = sa.create_engine(self.url, pool_size=max(1, concurrency), pool_pre_ping=True)
        create_extension(self.db)
        sa.event.listen(self.db, "connect", lambda dbapi_conn, _record: register_vector(dbapi_conn))
        self.db.dispose()  # connections made before the listener lack the vector type
        self._recovery = threading.Lock()
        self._lost = False  # a batch lost its connection: reconnect before the next one
        self._dims: set[int] = set()
        create_table(self.db, self.table)

    # -- schema ----------------------------------------------------------------------
    def _ensure_index(self, dim: int) -> None:
        """The HNSW cosine index of one dimension (created once, by whichever process is first)."""
        if dim in self._dims or not self.hnsw:
            return
        create_hnsw_index(self.db, self.table, dim, self.m, self.ef_construction)
        self._dims.add(dim)

    # -- the protocol ----------------------------------------------------------------
    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        """Ingests first (one transaction), then all searches (one statement), in a worker thread."""
        return await asyncio.to_thread(self._run_batch, list(calls))

    async def close(self) -> None:
        await asyncio.to_thread(self.db.dispose)

    def collection(self, name: str) -> list[Document]:
        """The documents of a collection, by id (for tests and inspection)."""
        self._recover_if_lost()
        with self.db.connect() as conn:
            rows = conn.execute(
                self._sa.text(f"SELECT id, text FROM {self.table} WHERE collection = :c ORDER BY id"), {"c": name}
            ).all()
        return [Document(r.id, r.text) for r in rows]

    def drop_collection(self, name: str) -> int:
        """Delete a collection's rows; returns how many there were."""
        self._recover_if_lost()
        with self.db.begin() as conn:
            result = conn.execute(self._sa.text(f"DELETE FROM {self.table} WHERE collection = :c"), {"c": name})
        return int(result.rowcount)

    # -- the worker thread -----------------------------------------------------------
    def _run_batch(self, calls: list[Call]) -> list[CallResult]:
        """The batch; once more if it lost its connection. A lost server is brought back first."""
        cause: BaseException | None = None
        for _ in range(2):
            try:
                self._recover_if_lost()
                return self._attempt(calls)
            except ConnectionLost as lost:
                self._lost, cause = True, lost.__cause__
            except Exception as exc:  # the server could not be brought back
                return [self._error(c, exc, restarting=True) for c in calls]
        assert cause is not None
        return [self._error(c, cause, lost=True) for c in calls]  # the next batch reconnects first

    def _recover_if_lost(self) -> None:
        """Reconnect after a lost connection: the embedded server is restarted if it is down."""
        if not self._lost:
            return
        with self._recovery:
            if not self._lost:
                return  # another batch did it meanwhile
            if self.embedded is not None:
                self.embedded.restart()
            self.db.dispose()  # its pooled connections are dead
            self._wait_until_up()
            self._lost = False

    @retry(wait=wait_exponential(multiplier=0.1, max=1.0), stop=stop_after_delay(30), reraise=True)
    def _wait_until_up(self) -> None:
        """Until a connection works (a restarted server recovers before it accepts queries)."""
        with self.db.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    def _attempt(self, calls: list[Call]) -> list[CallResult]:
        results: list[CallResult | None] = [None] * len(calls)
        ingests: list[Ingest] = []
        searches: list[Search] = []
        for i, call in enumerate(calls):
            try:
                if call.node.kind == PrimitiveKind.INGEST:
                    ingests.append((i, *self._ingest_args(call)))
                elif call.node.kind == PrimitiveKind.SEARCH and len(call.inputs["vectors"]) == 0:
                    results[i] = {"hits": []}  # no queries (e.g. a pipelined chunk the model left empty)
                elif call.node.kind == PrimitiveKind.SEARCH:
                    searches.append((i, *self._search_args(call)))
                else:
                    raise TypeError(f"{self.name} runs ingest and search primitives, not {call.node.describe()}")
            except (KeyError, TypeError, ValueError) as exc:  # this call fails alone
                results[i] = exc
        if ingests:
            for i, outcome in self._ingest(ingests, calls):
                results[i] = outcome
        if searches:
            for i, outcome in self._search(searches, calls):
                results[i] = outcome
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def _matrix(self, vectors: Any, call: Call, port: str) -> Any:
        np = self._np
        try:
            matrix = np.asarray(vectors, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{call.node.describe()}: `{port}` must be a list of equal-length vectors") from exc
        if matrix.ndim != 2 or (len(matrix) and matrix.shape[1] == 0):
            raise ValueError(f"{call.node.describe()}: `{port}` must be a list of vectors, got shape {matrix.shape}")
        return matrix

    def _ingest_args(self, call: Call) -> tuple[str, list[str], Any]:
        for port in ("texts", "vectors"):
            if port not in call.inputs:
                raise KeyError(f"{call.node.describe()} has no `{port}` input")
        texts = call.inputs["texts"]
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError(f"{call.node.describe()}: ingest needs a list of strings")
        vectors = self._matrix(call.inputs["vectors"], call, "vectors")
        if len(texts) != len(vectors):
            raise ValueError(f"{call.node.describe()}: ingest got {len(texts)} texts but {len(vectors)} vectors")
        return str(call.node.config.get("collection", call.query_id)), list(texts), vectors

    def _search_args(self, call: Call) -> tuple[str, Any, int]:
        for port in ("vectors", "index"):
            if port not in call.inputs:
                raise KeyError(f"{call.node.describe()} has no `{port}` input")
        if "top_k" not in call.node.config:
            raise KeyError(f"{call.node.describe()}: search needs a `top_k` config")
        top_k = int(call.node.config["top_k"])
        if top_k < 1:
            raise ValueError(f"{call.node.describe()}: top_k must be >= 1, got {top_k}")
        return str(call.inputs["index"]), self._matrix(call.inputs["vectors"], call, "vectors"), top_k

    def _ingest(self, ingests: list[Ingest], calls: list[Call]) -> list[tuple[int, CallResult]]:
        sa = self._sa
        outcomes: list[tuple[int, CallResult]] = []
        try:
            for _, _, _, vectors in ingests:
                if len(vectors):
                    self._ensure_index(int(vectors.shape[1]))
            with self.db.begin() as conn:
                for i, collection, texts, vectors in ingests:
                    try:
                        with conn.begin_nested():
                            upsert_rows(sa, conn, self.table, collection, texts, vectors, self.ingest_chunk_rows)
                        outcomes.append((i, {"index": collection}))
                    except sa.exc.DBAPIError as exc:  # rolled back to the savepoint: nothing of it written
                        if is_connection_lost(sa, exc):
                            raise  # the whole transaction is gone, not just this call's part
                        outcomes.append((i, self._error(calls[i], exc)))
        except sa.exc.SQLAlchemyError as exc:  # the transaction failed: nothing of the batch is written
            if is_connection_lost(sa, exc):
                raise ConnectionLost() from exc
            return [(i, self._error(calls[i], exc)) for i, _, _, _ in ingests]
        return outcomes

    def _search(self, searches: list[Search], calls: list[Call]) -> list[tuple[int, CallResult]]:
        sa = self._sa
        query = search_query(self.table, searches)
        statement = sa.text(query.sql)
        try:
            with self.db.begin() as conn:
                conn.exec_driver_sql(f"SET LOCAL hnsw.ef_search = {int(self.ef_search)}")
                conn.exec_driver_sql("SET LOCAL hnsw.iterative_scan = strict_order")
                if self.exact:
                    conn.exec_driver_sql("SET LOCAL enable_indexscan = off")
                rows = conn.execute(statement, query.params).all()
        except sa.exc.SQLAlchemyError as exc:
            if is_connection_lost(sa, exc):
                raise ConnectionLost() from exc
            return [(i, self._error(calls[i], exc)) for i, _, _, _ in searches]
        outcomes: list[tuple[int, CallResult]] = []
        for i, collection, hits in search_hits(searches, query, rows):
            if hits is None:
                outcomes.append((i, KeyError(f"{self.name}: no collection {collection!r} in {self.where}")))
            else:
                outcomes.append((i, {"hits": hits}))
        return outcomes

    def _error(self, call: Call, exc: BaseException, *, lost: bool = False, restarting: bool = False) -> PgVectorError:
        """A call's error: its primitive, its collection, the database and the cause."""
        if call.node.kind == PrimitiveKind.INGEST:
            what = f"ingest into collection {call.node.config.get('collection', call.query_id)!r}"
        else:
            what = f"search of collection {call.inputs.get('index')!r}"
        cause = first_line(exc)
        if restarting:
            cause = f"the connection was lost and the server could not be brought back: {cause}"
        elif lost:
            cause = f"the connection was lost, twice (the batch ran again after reconnecting): {cause}"
        error = PgVectorError(f"{call.node.describe()}: {what} failed on {self.where}: {cause}")
        error.__cause__ = exc
        return error
