"""Which graph runs may call a model server now: the first in line whose contexts fit its KV cache.

An agent's context grows every turn and it needs all of it at every call. When more runs
are under way than the server's KV cache holds, each run coming back from a tool finds
its prefix evicted by the others and the server computes it again, evicting the next
one's: the cache thrashes. vLLM says how big its cache is (`vllm:cache_config_info`:
`num_gpu_blocks` x `block_size`, read by `teola_adapters.server_load`), so Teola applies
the agent runtime's rule (`teola_core.agents.admission`) to the runs' model calls: a run
calls only while it is among the first runs in line whose contexts, summed, fit the
cache; the others wait before their next call, never inside one, and go in as the runs
ahead end. The first run always may, and an idle server always takes the next run in
line, so a cache too small for any one context never stops the work.

The line is by start, or by model calls made where the server's own costs say that pays
(`teola_core.agents.admission_order`: a run's recomputations cheaper than its writing),
read from the same `/metrics`.

A context's size is the call's prompt in tokens plus its answer. The server counts
tokens, Teola sees text: the size is the prompt's characters times the tokens per
character the server's own usage reports have shown so far (4 characters a token until
the first answer), plus the mean answer length seen.

    sets = WorkingSets()
    # returns at once, or when the runs ahead make room
    await sets.call(server, kv_tokens, costs, run="run3", rank=3, prompt_chars=41_000)
    sets.done(server, "run3", prompt_chars=41_000, usage=(10_250, 640)); sets.leave("run3")
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from teola_core.agents.admission import ProgramAdmission
from teola_core.agents.admission_order import choose_order
from teola_core.agents.token_rate import TokenRate
from teola_core.scheduler.server_costs import ServerCosts


def messages_chars(messages: Iterable[Any]) -> int:
    """The characters of a chat prompt: each message's content and tool calls, what the
    server's chat template renders."""
    chars = 0
    for message in messages:
        chars += len(str(getattr(message, "content", "") or ""))
        chars += sum(len(str(call)) for call in getattr(message, "tool_calls", None) or ())
    return chars


def message_usage(message: Any) -> tuple[int, int] | None:
    """The prompt and answer tokens a chat answer reports (`usage_metadata`), if any."""
    usage = getattr(message, "usage_metadata", None)
    if not usage:
        return None
    return int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))


class ServerWorkingSet:
    """One server's admitted runs (`ProgramAdmission` over its KV cache) and token rate."""

    def __init__(self, kv_tokens: int) -> None:
        self.kv_tokens = kv_tokens
        self.admission = ProgramAdmission(kv_tokens)
        self.rate = TokenRate()
        self.waits = 0  # calls that waited for runs ahead to make room
        self.calls = 0  # model calls asked for, over every run seen
        self.programs = 0  # runs seen
        self.choice = choose_order(None, self.rate, 0.0)

    async def call(self, run: str, costs: ServerCosts | None, *, rank: int, prompt_chars: int) -> None:
        """Return when `run` may call (at once if its context fits beside those ahead of it);
        `costs`: the server's latest, which choose the order."""
        self.calls += 1
        self.programs += run not in self.admission.rule.entries  # its first call here
        self.choice = choose_order(costs, self.rate, self.calls / self.programs)
        self.admission.set_order(self.choice.order)
        self.admission.set_context(run, rank=rank, tokens=self.rate.context_tokens(prompt_chars))
        if not self.admission.may_call(run):
            self.waits += 1
        await self.admission.call(run)

    def describe(self) -> str:
        admitted = self.admission.admitted()
        return (
            f"KV cache {self.kv_tokens} tokens: {len(admitted)} of {len(self.admission.rule.entries)} runs "
            f"admitted, {self.choice.reason} ({self.waits} calls waited for room)"
        )


class WorkingSets:
    """The working sets of the servers one event loop's runs call (see the module docstring)."""

    def __init__(self) -> None:
        self._servers: dict[str, ServerWorkingSet] = {}

    def at(self, server: str) -> ServerWorkingSet | None:
        return self._servers.get(server)

    async def call(
        self, server: str, kv_tokens: int, costs: ServerCosts | None, *, run: str, rank: int, prompt_chars: int
    ) -> None:
        """Wait until `run` may call `server`, whose KV cache holds `kv_tokens` tokens and whose
        work costs `costs` (its latest reading)."""
        working = self._servers.get(server)
        if working is None or working.kv_tokens != kv_tokens:
            previous = working
            working = self._servers[server] = ServerWorkingSet(kv_tokens)
            if previous is not None:  # the server was resized (restarted): keep what was learned
                working.rate = previous.rate
        await working.call(run, costs, rank=rank, prompt_chars=prompt_chars)

    def done(self, server: str, run: str, *, prompt_chars: int, usage: tuple[int, int] | None) -> None:
        """One of `run`'s calls to `server` ended; `usage` (prompt, answer tokens) where reported."""
        working = self._servers.get(server)
        if working is None:
            return
        if usage is not None:
            working.rate.observe(prompt_chars, *usage)
        working.admission.done(run)

    def leave(self, run: str) -> None:
        """The run ended: its room goes to the next runs in line at every server."""
        for working in self._servers.values():
            working.admission.leave(run)
