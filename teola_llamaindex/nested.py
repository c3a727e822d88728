"""Known parts inside an object Teola runs as itself: traced where they can be.

    shadow, parts = with_traced_parts(router, trace)   # router: a RouterQueryEngine over two engines
    shadow.query("why?")   # the router's own code; its RetrieverQueryEngines run on Teola

One level deep, by type: an attribute that is exactly a `RetrieverQueryEngine`, a list,
tuple or dict of them, or a `QueryEngineTool` around one, is replaced by `trace(engine)`
(a view of it whose `_query` runs on Teola: still a `RetrieverQueryEngine`) in a shallow
copy of the object (the user's object is not modified; what the object writes on itself
during a call lands on the copy). Deeper parts, and engines the object builds while it
runs (a composable graph's), run as they are.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.tools import QueryEngineTool

Trace = Callable[[RetrieverQueryEngine], RetrieverQueryEngine]


def with_traced_parts(obj: Any, trace: Trace) -> tuple[Any, int]:
    """(`obj`, or a shallow copy with its known parts traced; how many parts were traced)."""
    found = 0

    def swap(value: Any) -> Any:
        nonlocal found
        if type(value) is RetrieverQueryEngine:
            found += 1
            return trace(value)
        if type(value) is QueryEngineTool and type(value.query_engine) is RetrieverQueryEngine:
            found += 1
            tool = copy.copy(value)
            tool._query_engine = trace(value.query_engine)
            return tool
        return value

    def swapped(value: Any) -> Any:
        if isinstance(value, list | tuple):
            items = [swap(v) for v in value]
            return value if all(a is b for a, b in zip(items, value, strict=True)) else type(value)(items)
        if isinstance(value, dict):
            pairs = {k: swap(v) for k, v in value.items()}
            return value if all(pairs[k] is v for k, v in value.items()) else pairs
        return swap(value)

    state = {**getattr(obj, "__dict__", {}), **(getattr(obj, "__pydantic_private__", None) or {})}
    changes = {name: new for name, value in state.items() if (new := swapped(value)) is not value}
    if not changes:
        return obj, 0
    shadow = copy.copy(obj)
    for name, value in changes.items():
        setattr(shadow, name, value)
    return shadow, found
