"""Recognising LangChain components by class.

Teola recognises composition primitives, prompts, parsers and retrievers by their
*exact* class: a user subclass may override what they compute. One wrinkle: LangChain
builds some of them as parametrised pydantic generics (`RunnableParallel[dict[str,
Any]](...)` inside `.assign`), whose class is a pydantic-made subclass that only
carries type parameters. `class_of` maps such a class back to its generic origin.

Classes of packages Teola does not depend on are recognised by qualified name
(`qualified_name`) and only for the versions whose source was read (`installed_within`).
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from packaging.version import InvalidVersion, Version


def class_of(obj: Any) -> type:
    """The class that defines `obj`'s behaviour (the origin of a parametrised generic)."""
    cls = type(obj)
    while True:
        meta = getattr(cls, "__pydantic_generic_metadata__", None)
        origin = meta.get("origin") if meta else None
        if origin is None or origin is cls or cls.__dict__.get("__pydantic_generic_metadata__") is None:
            return cls
        cls = origin


def qualified_name(obj: Any) -> str:
    """`module.QualName` of the class that defines `obj`'s behaviour."""
    cls = class_of(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def installed_within(distribution: str, first: str, before: str) -> tuple[bool, str]:
    """Is the installed `distribution` in [first, before)? Also its version, for messages."""
    try:
        version = importlib.metadata.version(distribution)
        return Version(first) <= Version(version) < Version(before), version
    except (importlib.metadata.PackageNotFoundError, InvalidVersion):
        return False, "an unknown version"
