"""Fresh simulated servers for each test.

Per test, not per session: langchain-openai caches one async httpx client per base URL
for the whole process, and that client's connections belong to the event loop that
first used them; a later `asyncio.run` on the same URL fails with "Event loop is
closed" (plain LangChain too). A new server is a new URL, hence a new client.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("langchain_openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from teola_adapters.simulated.servers import SimServers


@pytest.fixture
def servers() -> Iterator[SimServers]:
    with SimServers(time_scale=0.01) as s:
        yield s
