"""Regenerate the demo corpus from the Python standard library's own docstrings.

    python -m teola.demo.build_corpus            # rewrites teola/demo/data/corpus.jsonl

Why docstrings: they are real technical prose, they ship with every Python (so the corpus
needs no network to rebuild) and they are under the PSF license, which allows
redistribution (see data/LICENSE-PSF.txt). The committed file was generated with
Python 3.11; other versions give slightly different paragraphs, which is why the file is
committed rather than built at run time.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

MODULES = (
    "json",
    "asyncio",
    "collections",
    "itertools",
    "functools",
    "pathlib",
    "re",
    "os",
    "subprocess",
    "threading",
    "logging",
    "argparse",
    "dataclasses",
    "typing",
    "unittest",
    "http.client",
    "http.server",
    "email.message",
    "sqlite3",
    "csv",
    "datetime",
    "shutil",
    "tempfile",
    "heapq",
    "bisect",
    "contextlib",
    "enum",
    "queue",
    "socket",
    "zipfile",
    "textwrap",
    "string",
    "statistics",
    "random",
    "decimal",
    "fractions",
    "urllib.parse",
    "base64",
    "hashlib",
    "pickle",
    "copy",
    "weakref",
    "abc",
    "inspect",
)
MIN_CHARS, MAX_CHARS = 160, 1200
OUT = Path(__file__).with_name("data") / "corpus.jsonl"


def _members(module: object) -> Iterator[tuple[str, object]]:
    """The module, then its public classes and functions (and their public methods), in source order."""
    name = module.__name__  # type: ignore[attr-defined]
    yield name, module
    for attr, value in sorted(vars(module).items()):
        if attr.startswith("_") or getattr(value, "__module__", None) != name:
            continue
        if inspect.isclass(value):
            yield f"{name}.{attr}", value
            for meth, inner in sorted(vars(value).items()):
                if not meth.startswith("_") and (inspect.isfunction(inner) or inspect.ismethoddescriptor(inner)):
                    yield f"{name}.{attr}.{meth}", inner
        elif inspect.isfunction(value):
            yield f"{name}.{attr}", value


def _is_prose(paragraph: str) -> bool:
    """Sentences, not code examples, tables or signatures."""
    if ">>>" in paragraph or paragraph.count("|") > 2 or paragraph.count("  ") > 6:
        return False
    letters = sum(c.isalpha() or c.isspace() for c in paragraph)
    return letters / len(paragraph) > 0.85 and paragraph.count(".") >= 1


def paragraphs() -> list[dict[str, str]]:
    """Unique prose paragraphs with the object they document."""
    seen: set[str] = set()
    out: list[dict[str, str]] = []
    with warnings.catch_warnings():  # deprecated aliases (typing.re) warn when touched
        warnings.simplefilter("ignore", DeprecationWarning)
        for module_name in MODULES:
            for source, obj in _members(importlib.import_module(module_name)):
                doc = obj.__doc__ if isinstance(obj, type) else inspect.getdoc(obj)
                for raw in re.split(r"\n\s*\n", inspect.cleandoc(doc) if doc else ""):
                    text = " ".join(raw.split())
                    if not (MIN_CHARS <= len(text) <= MAX_CHARS) or not _is_prose(text) or text in seen:
                        continue
                    seen.add(text)
                    out.append({"id": f"p{len(out):04d}", "source": source, "text": text})
    return out


def main() -> int:
    rows = paragraphs()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} paragraphs ({OUT.stat().st_size} bytes) to {OUT} with Python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
