"""Results of idempotent tools, shared across agents; identical in-flight calls merged.

A tool the user declares idempotent returns the same result for the same arguments
(a file read at a pinned commit, a search over a frozen index). Its results are kept
under (tool name, canonical arguments, user-given version): canonical means JSON with
sorted keys, so `{"a": 1, "b": 2}` and `{"b": 2, "a": 1}` are one call. A call that is
already running is awaited rather than started again. Failures are not kept: every
waiter of a failed call gets its exception and the next call runs the tool anew.

    cache = ToolResultCache()
    result = await cache.get_or_run("read_file", {"path": "a.py"}, "v1", lambda: read("a.py"))
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any


def canonical_args(args: Mapping[str, Any]) -> str:
    """The arguments as one canonical string (sorted keys, no spaces)."""
    try:
        return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except TypeError as exc:
        raise TypeError(f"tool arguments must be JSON values to be cached: {exc}") from exc


@dataclass
class ToolCacheStats:
    hits: int = 0  # answered from a finished call
    merged: int = 0  # answered by awaiting an identical call in flight
    runs: int = 0  # calls that ran the tool


class ToolResultCache:
    """(tool, canonical args, version) -> result; one instance per agent runtime."""

    def __init__(self) -> None:
        self._done: dict[tuple[str, str, str], Any] = {}
        self._running: dict[tuple[str, str, str], asyncio.Future[Any]] = {}
        self.stats = ToolCacheStats()

    def __len__(self) -> int:
        return len(self._done)

    async def get_or_run(
        self, tool: str, args: Mapping[str, Any], version: str, run: Callable[[], Awaitable[Any]]
    ) -> Any:
        key = (tool, canonical_args(args), version)
        if key in self._done:
            self.stats.hits += 1
            return self._done[key]
        running = self._running.get(key)
        if running is not None:
            self.stats.merged += 1
            try:
                return await asyncio.shield(running)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if running.cancelled() and task is not None and not task.cancelling():
                    return await self.get_or_run(tool, args, version, run)  # its runner went away, not us
                raise
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._running[key] = future
        self.stats.runs += 1
        try:
            result = await run()
        except asyncio.CancelledError:
            future.cancel()  # merged waiters run the tool themselves
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it, nobody else must
            raise
        else:
            self._done[key] = result
            future.set_result(result)
            return result
        finally:
            del self._running[key]
