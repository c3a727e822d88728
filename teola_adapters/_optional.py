"""Lazy imports of the real engines' optional dependencies.

The engine adapters import their heavy packages (llama.cpp, torch, SQLAlchemy, openai)
only when an engine is built, so `import teola_adapters.<engine>` is cheap everywhere and
a missing package fails with the extra that brings it, not with a bare ImportError.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingDependencyError(ImportError):
    """An engine's optional dependency is not installed; the message names the extra."""


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import `module` or fail naming the extra: `pip install "teola[<extra>]"`."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"{what} needs the Python package that provides `{module}`, which is not installed "
            f'({exc}). Install it with: pip install "teola[{extra}]"'
        ) from exc
