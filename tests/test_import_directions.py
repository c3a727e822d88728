"""Imports go one way between our packages: the core knows no framework, the benchmarks run
the examples, never the reverse."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

# importer -> packages it must not import (at any depth, lazily or not)
FORBIDDEN = {
    "teola_core": ("teola", "teola_langchain", "teola_llamaindex", "teola_examples", "teola_benchmarks"),
    "teola_examples": ("teola_benchmarks",),
}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("importer", sorted(FORBIDDEN))
def test_no_forbidden_imports(importer: str) -> None:
    spec = importlib.util.find_spec(importer)
    assert spec is not None and spec.submodule_search_locations, importer
    wrong = [
        f"{path.name}: {name}"
        for folder in spec.submodule_search_locations
        for path in sorted(Path(folder).rglob("*.py"))
        for name in sorted(_imports(path))
        if name.split(".")[0] in FORBIDDEN[importer]
    ]
    assert not wrong, f"{importer} imports {', '.join(FORBIDDEN[importer])}: {wrong}"
