"""Test files whose extra is not installed: reported as skipped, with what to install.

A folder's conftest sets `pytest_pycollect_makemodule = skip_unless(...)`; a test file there
is then collected as an `Unavailable` file (never imported: its imports would fail) whose
collection is a skip that names the missing modules.
"""

from __future__ import annotations

import fnmatch
import importlib.util
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest


class Unavailable(pytest.File):
    """A test file that cannot run here; collecting it reports a skip with `reason`."""

    reason: str = ""

    def collect(self) -> Iterable[Any]:
        pytest.skip(self.reason)


def missing(modules: Iterable[str]) -> list[str]:
    out = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            out.append(name)
    return out


def skip_unless(modules: Iterable[str], install: str, pattern: str = "test_*.py") -> Callable[..., Any]:
    """A `pytest_pycollect_makemodule` hook: files matching `pattern` skip when a module is missing."""
    absent = missing(modules)

    def pytest_pycollect_makemodule(module_path: Path, parent: Any) -> Any:
        if not absent or not fnmatch.fnmatch(module_path.name, pattern):
            return None
        file = Unavailable.from_parent(parent, path=module_path)
        file.reason = f"{module_path.parent.name}/ needs {', '.join(absent)}: {install}"
        return file

    return pytest_pycollect_makemodule
