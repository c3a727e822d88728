"""One local Ray cluster per test session (ray.init ≈ 3 s, shutdown ≈ 1 s on 2 cores)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """Start Ray once; ship the test helper modules to its workers by value (they are not installed)."""
    ray = pytest.importorskip("ray")
    import toy_engines

    sys.path.insert(0, str(Path(__file__).parent))
    import ray_test_engines

    for module in (toy_engines, ray_test_engines):
        ray.cloudpickle.register_pickle_by_value(module)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
