"""What an LLM engine offers agents: keep one program's KV between its calls.

An agent's next model call extends its previous prompt with the model's own answer and
the tool results. An engine that can hold the previous call's state (llama.cpp: a saved
context state; the simulated engine: pinned prefix-cache blocks; vLLM: not yet, there is
no pinning API) evaluates only the new tokens when the agent returns. Holding costs
memory other agents could use, so a hold has a time to live (the agent runtime computes
it from the observed tool durations, `teola_core.agents.ttl`) and the engine may refuse
it under memory pressure.

Engines that implement it subclass `KVRetention` besides `Engine`; the agent runtime
checks `isinstance(engine, KVRetention)` and otherwise only keeps the prefix warm.

    if isinstance(engine, KVRetention):
        kept = engine.retain("agent-7", prompt + answer, ttl_s=2.5)
        ...
        engine.release("agent-7")   # the agent is back (its call now holds the KV) or done

`discard` (optional) puts a finished program's private KV first in line for eviction.

An engine that can tell its KV pool's size and count a prompt's tokens (`KVPool`; the
simulated LLM, in-process vLLM) lets the runtime keep the running programs' contexts
within the pool (`teola_core.agents.admission`), with or without holds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class KVRetention(ABC):
    """Holds a program's KV (by program id) for a while; one hold per program."""

    @abstractmethod
    def retain(self, program: str, text: str, ttl_s: float) -> bool:
        """Keep the KV of `text` (the program's last prompt followed by the model's answer,
        exactly as the next prompt will begin) for `ttl_s` seconds of the engine's clock.

        Replaces the program's previous hold. Returns False (and holds nothing) when the
        engine cannot hold it now (memory pressure) or `ttl_s <= 0`.
        """

    @abstractmethod
    def release(self, program: str) -> None:
        """Drop the program's hold, if any (the KV itself may stay cached, unprotected)."""

    @abstractmethod
    def held_programs(self) -> frozenset[str]:
        """Programs whose hold is still in force (expired holds are not listed)."""

    def discard(self, text: str, keep: str) -> None:  # noqa: B027 - optional, a no-op by default
        """`text`'s KV past its prefix `keep` will not be used again (the program finished):
        evict it before anything else. Engines without an eviction order ignore it."""

    def reload_seconds(self, text: str) -> float | None:
        """How long re-prefilling `text` from nothing would take (None: unknown).

        The benefit side of the time-to-live rule; engines with a latency profile and a
        tokenizer know it.
        """
        return None


class KVPool(ABC):
    """An engine whose KV pool the agent runtime can size programs' contexts against."""

    @abstractmethod
    def kv_capacity_tokens(self) -> int | None:
        """The KV pool's size in tokens (None: not known yet)."""

    @abstractmethod
    def count_tokens(self, text: Any) -> int | None:
        """How many KV tokens the prompt `text` occupies (None: the engine cannot tell)."""
