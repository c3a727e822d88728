"""Whether an OpenAI-compatible server takes vLLM's `priority` request field: asked once.

    probe = PriorityProbe()
    probe.start("http://127.0.0.1:8000", "my-model")   # on the loop the calls run on
    ...
    if probe.accepted:                                 # False until the answer came, and after a refusal
        body["priority"] = rank

vLLM orders the requests waiting for a slot, and picks which running one to preempt when
its KV cache is full, by `priority` (lower first) under `--scheduling-policy priority`.
Under its default FCFS policy vLLM 0.32 ignores the field, older versions refuse a
non-zero one (400), and other servers may refuse the field at all. So Teola asks once, in
the background, with a one-token completion carrying `priority: 1`, and sends priorities
only where that was answered 200; calls made before the answer go without, as before.
"""

from __future__ import annotations

import asyncio
from typing import Any

from teola_adapters._optional import require
from teola_core.engines.protocol import Call

PROBE_TIMEOUT_S = 30.0  # a one-token completion; a CPU server busy with long prompts is slow


async def takes_priority(root_url: str, model: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """True when the server answers a one-token completion with `priority: 1` (200)."""
    httpx = require("httpx", "langchain", "Asking a model server whether it takes `priority`")
    body = {"model": model, "prompt": ".", "max_tokens": 1, "priority": 1}
    async with httpx.AsyncClient(base_url=root_url, timeout=timeout) as client:
        response = await client.post("/v1/completions", json=body)
    return response.status_code == 200


class PriorityProbe:
    """One server's answer to `takes_priority`, asked in the background by the first `start`."""

    def __init__(self) -> None:
        self.root_url: str | None = None
        self._task: asyncio.Task[bool] | None = None

    def start(self, root_url: str, model: str) -> None:
        """Ask (once; later calls do nothing), on the running loop."""
        if self._task is None:
            self.root_url = root_url
            self._task = asyncio.get_running_loop().create_task(takes_priority(root_url, model))

    @property
    def accepted(self) -> bool:
        """The server took `priority` (False while the answer is pending or if the probe failed)."""
        task = self._task
        return task is not None and task.done() and not task.cancelled() and task.exception() is None and task.result()

    async def settled(self) -> None:
        """Return once the server has answered (at once if nothing was asked)."""
        if self._task is not None:
            await asyncio.wait([self._task])

    def describe(self) -> str:
        """One line for `explain()`."""
        task = self._task
        if task is None or self.root_url is None:
            return "request priority: no OpenAI-compatible server found yet"
        if not task.done():
            return f"request priority: asking {self.root_url} whether it takes `priority`"
        if task.cancelled():
            return f"request priority: the question to {self.root_url} was cancelled; calls go without"
        if task.exception() is not None:
            return f"request priority: asking {self.root_url} failed ({task.exception()!r}); calls go without"
        if task.result():
            return (
                f"request priority: {self.root_url} takes `priority`: calls carry their program's rank "
                "(vLLM orders by it under --scheduling-policy priority)"
            )
        return f"request priority: {self.root_url} refused `priority`: calls go without"

    async def aclose(self) -> None:
        """Cancel a question still pending (on the loop it was asked on)."""
        task = self._task
        if task is None or task.done():
            return
        if task.get_loop() is not asyncio.get_running_loop():
            task.get_loop().call_soon_threadsafe(task.cancel)
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)  # its own cancellation, expected


def call_priority(call: Call) -> int:
    """The node's `priority` config (default 0; lower runs first), as vLLM takes it."""
    value = call.node.config.get("priority", 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{call.node.describe()}: `priority` must be an int, got {value!r}")
    return value


def with_priority(extra_body: dict[str, Any] | None, priority: int) -> dict[str, Any]:
    """An OpenAI client's `extra_body` with vLLM's `priority` added (the rest kept)."""
    return {**(extra_body or {}), "priority": priority}
