"""Every module of the project imports (a benchmark nobody's test imports once broke this way):
a module may only fail for want of an optional dependency, or a part of one (QueryPipeline
on llama-index-core 0.14), that is not installed here."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import tomllib
from pathlib import Path

import pytest
from project_packages import PACKAGES

ROOT = Path(__file__).resolve().parent.parent


def _not_walked(name: str) -> None:
    """A subpackage that failed to import is still listed: its own test reports why."""


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, package
        names.append(package)
        walk = pkgutil.walk_packages(spec.submodule_search_locations, prefix=f"{package}.", onerror=_not_walked)
        names += [info.name for info in walk]
    return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_module_imports(name: str) -> None:
    try:
        importlib.import_module(name)
    except ImportError as exc:  # ModuleNotFoundError included
        lacking = exc.name or ""
        if not lacking or lacking.split(".")[0] in PACKAGES:
            raise  # one of ours: a name that moved or a module that is gone
        pytest.skip(f"{name} needs {lacking} as installed here does not have it: {exc}")


def test_every_package_folder_ships() -> None:
    """pyproject lists packages one by one: a folder left out is missing from a plain install."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for package in PACKAGES
        for init in (ROOT / package).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert folders - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
