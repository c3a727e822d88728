"""The overload benchmark's mechanics on a short run: every request accounted for, nothing
held afterwards, nothing logged. Its figures (goodput, burst, RSS) are for `teola bench
--serve-overload` on a quiet machine, not for a test."""

from __future__ import annotations

import importlib.util
import os

import pytest

if any(importlib.util.find_spec(m) is None for m in ("aiohttp", "fastapi", "uvicorn", "langchain_core")):
    pytest.skip("the overload benchmark needs the serve and bench extras", allow_module_level=True)

from teola_benchmarks.overload.bench import run_overload


def test_a_short_overload_run_accounts_for_every_request_and_leaves_nothing_held() -> None:
    before = os.sched_getaffinity(0)
    result = run_overload(
        clients=8, warmup_s=0.5, capacity_s=2.0, overload_s=3.0, pause_s=1.0, burst_n=8, split_cpus=True
    )
    assert result.capacity_per_s > 0
    for phase in result.phases.values():
        assert phase.sent == phase.answered + phase.shed + phase.timed_out + sum(phase.other.values())
        assert not {k: v for k, v in phase.other.items() if k != "503"}  # no errors but refusals
    assert result.phases["overload"].sent >= 2 * result.phases["capacity"].sent  # it sent about 2R for 3 s
    assert result.slots_after == 0 and result.admitted_after == 0
    assert result.server_log == []  # no tracebacks, no warnings
    data = result.to_json()
    used = data["cpus_used"]
    if len(os.sched_getaffinity(0)) >= 2:  # the server and the load generator on CPUs of their own
        assert used["server"] and used["load"] and not set(used["server"]) & set(used["load"])
    assert os.sched_getaffinity(0) == before  # the generator's CPUs are given back
    assert set(data["checks"]) == {
        "goodput >= 0.8 R",
        "burst of 8 all answered within 3 s",
        "RSS after <= 1.5x before",
        "zero engine slots held after",
    }
