"""`teola bench --serve-overload`: `teola serve` under twice the load it can take.

    result = run_overload()          # ~45 s; result.checks says which targets held
    soak = run_soak(minutes=10)      # `--soak-minutes 10`: not for CI

The server runs `teola_benchmarks.overload.app:chain` (a 50 ms model) in a process of its
own, as `teola serve` with its defaults; the load comes from this process (aiohttp), on
the same CPUs, or with `split_cpus=True` the server on CPU 0 and the load generator on
the others (`CpuSplit`), as when clients run elsewhere.

1. capacity R: `clients` users closed-loop for `capacity_s` (after a short warm-up);
2. overload: Poisson arrivals at `factor` x R for `overload_s`, each with a `deadline_s`
   client deadline; goodput = answers within the deadline per second (target >= 0.8 R);
3. `pause_s` after the load stops, `burst` requests at once: all answered within the
   deadline; then the server's RSS (target <= 1.5 x before the overload) and the engine
   slots it holds (target 0).

The soak sends Poisson arrivals at 1.5 R for `minutes` with a 30 s client deadline:
every request must be answered or refused with a 503 (none lost), and RSS may grow by
less than 10 %.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from teola_benchmarks.overload.load import Client, Phase, burst, closed_loop, poisson

APP = "teola_benchmarks.overload.app:chain"
MODEL = "chain"
API_KEY = "overload-bench"


@dataclass(frozen=True)
class CpuSplit:
    """Which CPUs the server and the load generator run on (None: no split, all share)."""

    server: frozenset[int] | None
    load: frozenset[int] | None

    @classmethod
    def choose(cls, split: bool) -> CpuSplit:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if not split or len(cpus) < 2:
            return cls(None, None)
        return cls(frozenset(cpus[:1]), frozenset(cpus[1:]))

    def to_json(self) -> dict[str, list[int] | None]:
        parts = (("server", self.server), ("load", self.load))
        return {name: None if cpus is None else sorted(cpus) for name, cpus in parts}


@contextmanager
def load_generator_on(cpus: frozenset[int] | None) -> Iterator[None]:
    """Run this process (the load generator) on `cpus` for the block, then as before."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


class Server:
    """`teola serve` in a subprocess; its stderr lines are kept (they should be few)."""

    def __init__(self, extra_args: tuple[str, ...] = (), cpus: frozenset[int] | None = None) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "teola.cli", "serve", APP, "--port", str(self.port)]
        command += ["--api-key", API_KEY, "--log-level", "warning", *extra_args]
        self.process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        if cpus is not None:  # before it starts serving: the pid exists as soon as Popen returns
            os.sched_setaffinity(self.process.pid, cpus)
        self.log: list[str] = []
        self._drain = threading.Thread(target=self._read_log, daemon=True)
        self._drain.start()
        self._wait_ready()

    def _read_log(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line.rstrip())

    def _wait_ready(self, timeout: float = 120.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise RuntimeError(f"teola serve exited ({self.process.returncode}): {' | '.join(self.log[-5:])}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)  # polling a starting process: there is no event to wait on
        raise TimeoutError(f"teola serve did not answer /health within {timeout} s")

    def metrics(self) -> dict[str, float]:
        """The /metrics samples this benchmark reads, summed over their labels."""
        text = httpx.get(f"{self.url}/metrics", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10).text
        wanted = (
            "process_resident_memory_bytes",
            "teola_engine_running_batches",
            "teola_admission_running",
            "teola_admission_waiting",
            "teola_client_disconnects_total",
        )
        out = dict.fromkeys(wanted, 0.0)
        for line in text.splitlines():
            match = re.match(r"^([a-z_]+)(?:\{[^}]*\})? ([0-9.e+-]+)$", line)
            if match and match.group(1) in out:
                out[match.group(1)] += float(match.group(2))
        return out

    def settled_slots(self, timeout: float = 5.0) -> tuple[float, float]:
        """Engine slots and admitted queries still held, once they reach 0 (or after `timeout`)."""
        end = time.monotonic() + timeout
        while True:
            m = self.metrics()
            held = (m["teola_engine_running_batches"], m["teola_admission_running"])
            if held == (0.0, 0.0) or time.monotonic() > end:
                return held
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._drain.join(5)


@contextmanager
def serving(extra_args: tuple[str, ...] = (), cpus: CpuSplit | None = None) -> Iterator[Server]:
    cpus = cpus or CpuSplit(None, None)
    server = Server(extra_args, cpus.server)
    try:
        with load_generator_on(cpus.load):
            yield server
    finally:
        server.stop()


@dataclass
class OverloadResult:
    capacity_per_s: float
    phases: dict[str, Phase]
    rss_before: float
    rss_after: float
    slots_after: float
    admitted_after: float
    disconnects: float
    server_log: list[str]
    load: dict[str, tuple[float, float, float]]
    cpus: CpuSplit = field(default_factory=lambda: CpuSplit(None, None))
    checks: dict[str, bool] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "capacity_per_s": round(self.capacity_per_s, 1),
            "cpus_used": self.cpus.to_json(),
            "phases": {name: p.to_json() for name, p in self.phases.items()},
            "rss_before_mib": round(self.rss_before / 2**20, 1),
            "rss_after_mib": round(self.rss_after / 2**20, 1),
            "engine_slots_held_after": self.slots_after,
            "queries_admitted_after": self.admitted_after,
            "client_disconnects_counted": self.disconnects,
            "server_log_lines": len(self.server_log),
            "load_average": self.load,
            "cpus": os.cpu_count(),
            "checks": self.checks,
        }


async def _overload(
    server: Server,
    *,
    clients: int,
    warmup_s: float,
    capacity_s: float,
    overload_s: float,
    factor: float,
    deadline_s: float,
    pause_s: float,
    burst_n: int,
    seed: int,
) -> OverloadResult:
    load = {"before": os.getloadavg()}
    client = Client(server.url, API_KEY, MODEL)
    try:
        await closed_loop(client, clients, warmup_s, deadline_s)
        capacity = await closed_loop(client, clients, capacity_s, deadline_s)
        rate = capacity.goodput
        rss_before = server.metrics()["process_resident_memory_bytes"]
        overload = await poisson(client, factor * rate, overload_s, deadline_s, seed, "overload")
        await asyncio.sleep(pause_s)  # the benchmark's stated pause after the load stops
        after = await burst(client, burst_n, deadline_s)
    finally:
        await client.close()
    metrics = server.metrics()
    slots, admitted = server.settled_slots()
    load["after"] = os.getloadavg()
    result = OverloadResult(
        capacity_per_s=rate,
        phases={"capacity": capacity, "overload": overload, "burst": after},
        rss_before=rss_before,
        rss_after=metrics["process_resident_memory_bytes"],
        slots_after=slots,
        admitted_after=admitted,
        disconnects=metrics["teola_client_disconnects_total"],
        server_log=list(server.log),
        load=load,
    )
    result.checks = {
        "goodput >= 0.8 R": overload.goodput >= 0.8 * rate,
        f"burst of {burst_n} all answered within {deadline_s:g} s": after.answered == burst_n,
        "RSS after <= 1.5x before": result.rss_after <= 1.5 * result.rss_before,
        "zero engine slots held after": slots == 0 and admitted == 0,
    }
    return result


def run_overload(
    *,
    clients: int = 32,
    warmup_s: float = 3.0,
    capacity_s: float = 10.0,
    overload_s: float = 20.0,
    factor: float = 2.0,
    deadline_s: float = 3.0,
    pause_s: float = 3.0,
    burst_n: int = 32,
    seed: int = 0,
    server_args: tuple[str, ...] = (),
    split_cpus: bool = False,
) -> OverloadResult:
    cpus = CpuSplit.choose(split_cpus)
    with serving(server_args, cpus) as server:
        result = asyncio.run(
            _overload(
                server,
                clients=clients,
                warmup_s=warmup_s,
                capacity_s=capacity_s,
                overload_s=overload_s,
                factor=factor,
                deadline_s=deadline_s,
                pause_s=pause_s,
                burst_n=burst_n,
                seed=seed,
            )
        )
    result.cpus = cpus
    return result


@dataclass
class SoakResult:
    capacity_per_s: float
    soak: Phase
    rss_mib: list[float]  # one sample a minute, the first after the warm-up
    slots_after: float
    load: dict[str, tuple[float, float, float]]
    cpus: CpuSplit = field(default_factory=lambda: CpuSplit(None, None))
    checks: dict[str, bool] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "capacity_per_s": round(self.capacity_per_s, 1),
            "cpus_used": self.cpus.to_json(),
            "soak": self.soak.to_json(),
            "lost": self.soak.lost,
            "rss_mib_per_minute": self.rss_mib,
            "engine_slots_held_after": self.slots_after,
            "load_average": self.load,
            "checks": self.checks,
        }


async def _soak(server: Server, *, minutes: float, factor: float, clients: int, seed: int) -> SoakResult:
    load = {"before": os.getloadavg()}
    client = Client(server.url, API_KEY, MODEL)
    rss: list[float] = []
    try:
        await closed_loop(client, clients, 3.0, 30.0)
        rate = (await closed_loop(client, clients, 10.0, 30.0)).goodput
        total = Phase("soak", window_s=0.0)
        for minute in range(max(1, round(minutes))):
            rss.append(round(server.metrics()["process_resident_memory_bytes"] / 2**20, 1))
            part = await poisson(client, factor * rate, 60.0, 30.0, seed + minute, "soak")
            total.window_s += part.window_s
            total.sent += part.sent
            total.answered += part.answered
            total.shed += part.shed
            total.timed_out += part.timed_out
            total.latencies += part.latencies
            for name, n in part.other.items():
                total.other[name] = total.other.get(name, 0) + n
        rss.append(round(server.metrics()["process_resident_memory_bytes"] / 2**20, 1))
    finally:
        await client.close()
    slots, admitted = server.settled_slots()
    load["after"] = os.getloadavg()
    result = SoakResult(rate, total, rss, slots + admitted, load)
    result.checks = {
        "RSS growth < 10 %": rss[-1] < 1.10 * rss[0],
        "every request answered or refused with 503": total.lost == 0,
        "zero engine slots held after": slots + admitted == 0,
    }
    return result


def run_soak(
    *, minutes: float = 10.0, factor: float = 1.5, clients: int = 32, seed: int = 0, split_cpus: bool = False
) -> SoakResult:
    cpus = CpuSplit.choose(split_cpus)
    with serving(cpus=cpus) as server:
        result = asyncio.run(_soak(server, minutes=minutes, factor=factor, clients=clients, seed=seed))
    result.cpus = cpus
    return result
