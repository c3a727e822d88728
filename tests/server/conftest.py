"""Server tests: a real uvicorn server on 127.0.0.1 (ephemeral port) per test module.

Skipped as a whole when the `serve` extra (fastapi, uvicorn, openai, prometheus-client)
or langchain-core is missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from unavailable import skip_unless

pytest_pycollect_makemodule = skip_unless(
    ("fastapi", "uvicorn", "openai", "prometheus_client", "langchain_core", "httpx"), "pip install 'teola[serve,dev]'"
)


@pytest.fixture(scope="module")
def served() -> Iterator[Any]:
    from server_fakes import build_apps
    from server_support import API_KEY, Served

    from teola.server import BackgroundServer, create_app, wrap_app

    built = build_apps()
    apps = [wrap_app(name, app) for name, app in built["apps"].items()]
    server = BackgroundServer(create_app(apps, api_key=API_KEY))
    url = server.start()
    try:
        yield Served(url, built["apps"], built["started"], built["cancelled"])
    finally:
        server.stop()
