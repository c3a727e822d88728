"""What every traced LlamaIndex graph shares: the opaque-module warning, the skip marker, errors.

- `SKIPPED` is the value of a module that a conditional link kept from running; it flows
  along data edges so the modules behind it are skipped too, as QueryPipeline does.
- `unwrap_error` gives the caller the exception the user's component raised, with a
  note naming the module (Teola's `PrimitiveError` never reaches the user).
"""

from __future__ import annotations

from typing import Final

from teola_core.ir.errors import PrimitiveError


class OpaqueModuleWarning(UserWarning):
    """A module Teola cannot see into runs as one opaque `call` (warned once per module)."""


class _Skipped:
    """The single marker of a module that did not run (see the module docstring)."""

    _instance: _Skipped | None = None

    def __new__(cls) -> _Skipped:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "SKIPPED"


SKIPPED: Final = _Skipped()


def unwrap_error(exc: BaseException, where: dict[str, str]) -> BaseException:
    """The user's own exception, noted with the module (from `where`: node id -> module)."""
    while isinstance(exc, PrimitiveError):
        inner = exc.error
        node_id = exc.node.split(" ", 1)[0]
        module = where.get(node_id)
        place = f"module {module}, primitive {exc.node}" if module else f"primitive {exc.node}"
        inner.add_note(f"teola: raised in {place}")
        exc = inner
    return exc
