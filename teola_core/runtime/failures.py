"""One exception per failed query, so what one query adds to it stays its own.

An engine batch serves several queries; when it fails as a whole (its `run` raised, or
it timed out), or returns one exception object for several calls, each call gets its own
copy: same type and message (a user's `except ConnectionError` still catches it), the
original as `__cause__`. Adapters add a note naming the step to the exception they
re-raise; with a shared object, 8 failed queries meant one error with 8 notes.

    errors = own_copies(ConnectionError("engine is down"), 3)   # 3 distinct, same cause
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any


def own_copy(error: BaseException) -> BaseException:
    """A fresh exception of `error`'s type, args and attributes (no notes), caused by it."""
    cls = type(error)
    try:
        copy = cls.__new__(cls, *error.args)  # no __init__: works whatever its signature
        copy.__dict__.update({k: v for k, v in vars(error).items() if k != "__notes__"})
    except Exception:  # an exception type that cannot be rebuilt: one that says what it was
        copy = RuntimeError(f"{cls.__name__}: {error}")
    copy.__cause__ = error
    return copy


def own_copies(error: BaseException, n: int) -> list[BaseException]:
    return [own_copy(error) for _ in range(n)]


def distinct_results(results: Sequence[Any]) -> list[Any]:
    """An engine's results with every exception object that fills several slots copied."""
    shared = Counter(id(r) for r in results if isinstance(r, BaseException))
    return [own_copy(r) if isinstance(r, BaseException) and shared[id(r)] > 1 else r for r in results]


def checked_results(engine: str, n_calls: int, results: Sequence[Any]) -> list[Mapping[str, Any] | BaseException]:
    """An engine's batch results: one per call, each outputs or an exception of its own."""
    if len(results) != n_calls:
        raise RuntimeError(f"engine {engine!r} returned {len(results)} results for a batch of {n_calls} calls")
    return [
        r
        if isinstance(r, BaseException | Mapping)
        else TypeError(f"engine {engine!r} returned {type(r).__name__}, not a mapping")
        for r in distinct_results(results)
    ]
