"""Which keys of its dict input a step reads, proven from the step itself (never from names).

    reads(ChatPromptTemplate.from_template("{q} {ctx}"))   # frozenset({"q", "ctx"})
    reads(itemgetter("q") | retriever)                      # {"q"}: only the first step sees the dict
    reads(RunnableLambda(fn))                               # None: a function may read anything

A step that reads only some keys returns the same output from any dict that holds those
keys with the same values, so it may start before the other keys exist
(`tracing/early_steps.py`). What is proven: a prompt Teola renders reads its variables (template,
optional and partial); `itemgetter(...)` in a `RunnableLambda` and `RunnablePick` read
their keys; a sequence reads what its first step reads; a parallel or a branch what any
of its parts reads; a binding what its bound step reads. Anything else, and anything
whose methods were replaced, reads everything (None).
"""

from __future__ import annotations

import operator
from typing import Any

from langchain_core.runnables import (
    Runnable,
    RunnableBinding,
    RunnableBranch,
    RunnableLambda,
    RunnableParallel,
    RunnableSequence,
)
from langchain_core.runnables.passthrough import RunnablePick

from teola_langchain.components.classes import class_of
from teola_langchain.components.models import is_binding
from teola_langchain.components.patched import METHODS, runs_own_code
from teola_langchain.components.prompts import describe, is_prompt

Keys = frozenset[str] | None  # None: every key


def reads(step: Runnable[Any, Any]) -> Keys:
    """The keys of a dict input that `step` reads (see the module docstring)."""
    kind = class_of(step)
    if is_prompt(step) and _own_methods(step):
        return frozenset(describe(step).ports)
    if kind is RunnableLambda and _own_methods(step):
        return _itemgetter_keys(step)
    if kind is RunnablePick and _own_methods(step):
        return frozenset([step.keys] if isinstance(step.keys, str) else step.keys)
    if kind is RunnableSequence and runs_own_code(step, RunnableSequence):
        return reads(step.first)
    if kind is RunnableParallel and runs_own_code(step, RunnableParallel):
        return union(reads(s) for s in step.steps__.values())
    if kind is RunnableBranch and runs_own_code(step, RunnableBranch):
        parts = [p for pair in step.branches for p in pair]
        return union(reads(p) for p in (*parts, step.default))
    if is_binding(step) and runs_own_code(step, RunnableBinding) and not step.config_factories and not step.kwargs:
        return reads(step.bound)
    return None


def union(parts: Any) -> Keys:
    keys: set[str] = set()
    for part in parts:
        if part is None:
            return None
        keys |= part
    return frozenset(keys)


def _own_methods(step: Runnable[Any, Any]) -> bool:
    """Neither the instance nor a subclass replaced the methods LangChain calls."""
    instance = {**vars(step), **(getattr(step, "__pydantic_extra__", None) or {})}
    return not any(name in instance for name in METHODS)


def _itemgetter_keys(step: RunnableLambda[Any, Any]) -> Keys:
    """The keys of `RunnableLambda(itemgetter(...))` (sync only: an `afunc` may read anything)."""
    func = getattr(step, "func", None)
    if not isinstance(func, operator.itemgetter) or getattr(step, "afunc", None) is not None:
        return None
    _, keys = func.__reduce__()
    if not all(isinstance(k, str) for k in keys):
        return None
    return frozenset(keys)


def reshapes_only(step: Runnable[Any, Any]) -> bool:
    """`step` only reshapes data (no model, no I/O): a prompt Teola renders, one of LangChain's
    own output parsers, an item getter or pick, a plain passthrough."""
    from langchain_core.output_parsers import BaseOutputParser
    from langchain_core.runnables import RunnablePassthrough

    kind = class_of(step)
    if is_prompt(step):
        return True
    if isinstance(step, BaseOutputParser):
        return kind.__module__.startswith("langchain_core.")
    if kind is RunnablePassthrough:
        return step.func is None and step.afunc is None
    return reads(step) is not None and kind in (RunnableLambda, RunnablePick)
