"""Handlers LangChain adds while a context variable holds them: its `register_configure_hook`.

Every callback manager LangChain configures while such a variable holds a handler gets
that handler (non-inheritable: no step finds it in its config's callbacks). Teola watches
an optimized chain's call this way (`planning/learning.py`: its `Observer`) and an optimized
graph's run (`program_order/gate.py`: its `RunGate`), without touching the user's objects.

    OBSERVER: ContextVar[Observer | None] = ContextVar("observer", default=None)
    register_configure_hook(OBSERVER, inheritable=False)
    with holding(OBSERVER, observer):    # every run configured here reports to observer
        ...
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

H = TypeVar("H")


@contextmanager
def holding(var: ContextVar[H | None], handler: H) -> Iterator[None]:
    """`var` holds `handler` inside the block (and in contexts copied from inside it)."""
    token = var.set(handler)
    try:
        yield
    finally:
        var.reset(token)
