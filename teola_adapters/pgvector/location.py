"""Where a store's database is: its URL as SQLAlchemy needs it, the embedded server's data
folder, and the URL as error messages may show it (no password)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path


def default_pgdata() -> Path:
    """Where the embedded server keeps its data unless told otherwise (kept across runs)."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"teola-pgdata-{uid}"


def sqlalchemy_url(url: str) -> str:
    """A Postgres URL with the psycopg 3 driver named (what SQLAlchemy needs to pick it)."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    raise ValueError(f"not a Postgres URL: {url.split('@')[-1]!r}")


def redact(url: str) -> str:
    """The URL without its password, for error messages."""
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)
