"""The store's errors, and how a database error is read: a lost connection (run the batch
again after reconnecting) or a failed statement (the calls fail)."""

from __future__ import annotations

from typing import Any


class PgVectorError(RuntimeError):
    """A database operation failed; the message names the primitive, the collection, the
    database and the cause."""


class ConnectionLost(Exception):
    """A batch lost its connection to the server; `__cause__` is SQLAlchemy's error."""


def is_connection_lost(sa: Any, exc: BaseException) -> bool:
    """Whether an error means the connection (or the server) is gone, not a bad statement."""
    return bool(getattr(exc, "connection_invalidated", False)) or isinstance(
        exc, sa.exc.OperationalError | sa.exc.PendingRollbackError
    )


def first_line(exc: BaseException) -> str:
    """The first line of a database error (the driver's own, when SQLAlchemy wraps one)."""
    text = str(getattr(exc, "orig", None) or exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
