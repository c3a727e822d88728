"""Recognising LangChain components by class.

Teola recognises composition primitives, prompts, parsers and retrievers by their
*exact* class: a user subclass may override what they compute. One wrinkle: LangChain
builds some of them as parametrised pydantic generics (`RunnableParallel[dict[str,
Any]](...)` inside `.assign`), whose class is a pydantic-made subclass that only
carries type parameters. `class_of` maps such a class back to its generic origin.
"""

from __future__ import annotations

from typing import Any


def class_of(obj: Any) -> type:
    """The class that defines `obj`'s behaviour (the origin of a parametrised generic)."""
    cls = type(obj)
    while True:
        meta = getattr(cls, "__pydantic_generic_metadata__", None)
        origin = meta.get("origin") if meta else None
        if origin is None or origin is cls or cls.__dict__.get("__pydantic_generic_metadata__") is None:
            return cls
        cls = origin
