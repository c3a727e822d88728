"""What every object `teola.optimize` returns has alike (the drop-in family): the one check
each framework's tests run on their rows (chains, graphs, agents, query engines, pipelines,
workflows), so the seven classes cannot drift apart again.

    await check_drop_in(original, teola.optimize(original), lambda app: app.ainvoke(x))
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from teola_core.dropin import DropIn
from teola_core.runtime.base import PrimitiveSpan

SHARED = ("original", "explain", "close", "aclose", "where", "add_hook", "runtime", "recent", "engine_names")


class Spans:
    """A runtime hook that keeps every span."""

    def __init__(self) -> None:
        self.spans: list[PrimitiveSpan] = []

    def on_span(self, span: PrimitiveSpan) -> None:
        self.spans.append(span)


async def check_drop_in(original: Any, fast: Any, run: Callable[[Any], Awaitable[Any]]) -> Any:
    """`fast` is a drop-in for `original` with the family's API: the same answer from
    `run(app)`, a hook that sees the run, `runtime()` one per loop, `where()` per engine,
    `explain()` with the plan and the run, both context managers closing it, and a call after
    closing that starts afresh. Returns the plain answer."""
    assert isinstance(fast, DropIn), f"{type(fast).__name__} is not on the drop-in kit"
    missing = [name for name in SHARED if not hasattr(fast, name)]
    assert not missing, f"{type(fast).__name__} lacks {missing}"
    assert fast.original is original
    spans = Spans()
    fast.add_hook(spans)
    plain = await run(original)
    assert await run(fast) == plain
    assert spans.spans, "the hook saw none of the run's primitives"
    assert fast.runtime() is fast.runtime()  # one per loop
    where = fast.where()
    assert where and all(isinstance(place, str) for place in where.values())
    text = fast.explain()
    assert text.startswith("Teola plan for") or text.startswith("QueryPipeline runs as itself"), text[:80]
    assert "== recent runs ==\n- " in text and "timed primitives" in text
    async with fast as entered:
        assert entered is fast
    assert await run(fast) == plain  # closed: the next call starts afresh
    await asyncio.to_thread(_sync_close, fast)
    return plain


def _sync_close(fast: Any) -> None:
    with fast as entered:
        assert entered is fast
