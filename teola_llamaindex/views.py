"""The user's object seen through its own class with a few methods of Teola's.

    view = framework_view(engine, _query=dispatcher.span(run_on_teola))
    view.query("why?")   # LlamaIndex's own `query` (span, events, callbacks), Teola's `_query`

A view shares the object's state (its `__dict__`, and pydantic's private, extra and
fields-set records are the very same objects), and its class is a subclass with the
same name and module, so the framework's code runs on it unchanged, writes land on the
user's object, and spans are named after the user's class. Only the given methods
differ; the user's object and class are never modified.
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")

_STATE = ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__")


def framework_view(obj: T, **methods: Any) -> T:
    """`obj` with `methods` in place of its class's (see the module docstring)."""
    cls = type(obj)
    namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, **methods}
    # `type.__new__` with the object's own metaclass: the class is made without the
    # metaclass's construction hooks (pydantic would rebuild a schema: slow, and it fails
    # for recursive models such as QueryPipeline); a view only swaps methods.
    hooked = type.__new__(type(cls), cls.__name__, (cls,), namespace)
    view = object.__new__(hooked)
    for name in _STATE:
        try:
            state = object.__getattribute__(obj, name)
        except AttributeError:
            continue
        object.__setattr__(view, name, state)
    return view  # type: ignore[return-value]
