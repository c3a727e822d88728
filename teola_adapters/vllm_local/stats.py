"""What the in-process vLLM engine counts (`engine.stats`), and the stat logger through
which vLLM's scheduler reports its prefix-cache counters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class VLLMLocalStats:
    warmups: int = 0  # partial-prefill requests run
    warm_tokens: int = 0  # prompt tokens they prefilled (whole blocks)
    decodes: int = 0  # decode requests (streamed or not)
    failures: int = 0  # calls that failed
    decode_cached_tokens: int = 0  # prompt tokens decodes found in the prefix cache (num_cached_tokens)
    prefix_cache_queries: int = 0  # vLLM's counter: prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # vLLM's counter: of those, tokens found cached


def prefix_cache_logger(count: Callable[[int, int], None]) -> Any:
    """A vLLM stat-logger factory handing the scheduler's prefix-cache counts (queries, hits) to `count`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class PrefixCacheCounter(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            cache = getattr(scheduler_stats, "prefix_cache_stats", None)
            if cache is not None:
                count(int(cache.queries), int(cache.hits))

        def log_engine_initialized(self) -> None:
            pass

    return PrefixCacheCounter
