"""The paper's four workloads, by name."""

from __future__ import annotations

from teola_benchmarks.workloads import advanced_rag, contextual_rag, naive_rag, search_gen
from teola_benchmarks.workloads.base import Workload

WORKLOADS: dict[str, Workload] = {
    w.name: w for w in (search_gen.WORKLOAD, naive_rag.WORKLOAD, advanced_rag.WORKLOAD, contextual_rag.WORKLOAD)
}

__all__ = ["WORKLOADS", "Workload"]
