"""One real multi-node Ray cluster on loopback per test session (`ray.cluster_utils.Cluster`).

Nodes: a head (1 CPU), "nodeA" and "nodeB" (2 CPUs each, custom resources `nodeA`/`nodeB`),
so tests can place engines by resource. Tests that kill a node add their own nodes and
remove them (the shared ones stay). ray.init ≈ 3 s and each node ≈ 2 s on 2 cores, so the
cluster is started once; Ray's health checks are tightened so a killed node is declared
dead within a few seconds.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Node death is declared after `period * threshold` of missed health checks (Ray's default: ~15 s).
SYSTEM_CONFIG = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3, "health_check_timeout_ms": 2000}


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """The session's cluster, connected; test helper modules ship to workers by value (not installed)."""
    ray = pytest.importorskip("ray")
    import toy_engines
    from ray.cluster_utils import Cluster

    sys.path.insert(0, str(Path(__file__).parent))
    import ray_test_engines

    for module in (toy_engines, ray_test_engines):
        ray.cloudpickle.register_pickle_by_value(module)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "_system_config": SYSTEM_CONFIG},
    )
    try:
        cluster.add_node(num_cpus=2, resources={"nodeA": 4})
        cluster.add_node(num_cpus=2, resources={"nodeB": 4})
        ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
        try:
            yield cluster
        finally:
            ray.shutdown()
    finally:
        cluster.shutdown()


@pytest.fixture
def resource_nodes(ray_cluster: Any) -> dict[str, str]:
    """Custom resource name -> id of the live node that offers it."""
    import ray

    builtin = ("node:", "CPU", "GPU", "memory", "object_store_memory")
    return {
        resource: node["NodeID"]
        for node in ray.nodes()
        if node["Alive"]
        for resource in node["Resources"]
        if not resource.startswith(builtin)
    }
