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
        v = Version(version)
    except (importlib.metadata.PackageNotFoundError, InvalidVersion):
        return False, "an unknown version"
    # By release numbers at the top, so that pre-releases of `before` (1.1.0rc1) are out too.
    return Version(first) <= v and v.release < Version(before).release, version


# langchain-classic (LangChain's pre-1.0 chains and retrievers), whose source was read
# at 1.0.8: its classes are recognised for these versions only, as [first, before).
LANGCHAIN_CLASSIC = ("langchain-classic", "1.0.0", "1.1")


def is_classic(obj: Any, name: str) -> bool:
    """`obj`'s exact class is langchain-classic's `name`, in a version whose source was read."""
    return qualified_name(obj) == name and installed_within(*LANGCHAIN_CLASSIC)[0]
