"""Whether an object still runs LangChain's own code for the methods Teola reproduces.

Teola executes a composite (a sequence, a parallel, ...) itself only when that would run
exactly LangChain's code: the object's class is the library's and neither the class nor
the instance has had `invoke`, `ainvoke`, `batch` or `abatch` replaced (a test spy, a
monkeypatch, a subclass). Otherwise the object runs as one step, through its own methods.

The library's functions are recorded when this module is first imported. A tool that
routes calls without changing what they do (Teola's conformance harness) marks its
wrapper with `__teola_transparent__ = <the function it wraps>`.
"""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableBinding, RunnableBranch, RunnableParallel, RunnableSequence
from langchain_core.runnables.base import RunnableEach
from langchain_core.runnables.passthrough import RunnableAssign

METHODS = ("invoke", "ainvoke", "batch", "abatch")

_ORIGINALS: dict[type, dict[str, Any]] = {
    cls: {name: getattr(cls, name) for name in METHODS}
    for cls in (RunnableSequence, RunnableParallel, RunnableAssign, RunnableBranch, RunnableEach, RunnableBinding)
}


def _same(current: Any, original: Any) -> bool:
    return current is original or getattr(current, "__teola_transparent__", None) is original


def runs_own_code(obj: Any, cls: type) -> bool:
    """`obj` (an instance of exactly `cls`, or a parametrised alias of it) runs `cls`'s own methods."""
    originals = _ORIGINALS[cls]
    instance = {**vars(obj), **(getattr(obj, "__pydantic_extra__", None) or {})}
    for name, original in originals.items():
        if name in instance or not _same(getattr(type(obj), name), original):
            return False
    return True
