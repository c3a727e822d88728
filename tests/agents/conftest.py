"""Async tests here run on a fresh event loop each, bounded so a hang fails instead of blocking."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

TIMEOUT_S = 60.0


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    kwargs: dict[str, Any] = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}

    async def bounded() -> None:
        await asyncio.wait_for(pyfuncitem.obj(**kwargs), TIMEOUT_S)

    asyncio.run(bounded())
    return True
