"""`teola explain module:attr`: what Teola would do with an app, what it expects to gain, what blocks more.

    teola explain my_app.chains:rag_chain                  # a LangChain runnable, LlamaIndex object, ...
    teola explain my_app.chains:build_chain --call         # a function that returns one, called with no arguments
    teola explain my_app:chain --profiles app.json --png pictures/

The object is optimized (`teola.optimize`, nothing runs) and its `explain()` printed; an
object that is already optimized is explained as it is. The current folder is importable,
as for `python -m`. `--profiles` reads a file of learned profiles (`profiles="app.json"`),
so the explanation uses what a running app learned.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import Any


def add_explain_command(commands: Any) -> None:
    """Register `teola explain` on the `teola` command's subparsers."""
    parser = commands.add_parser(
        "explain",
        help="print how Teola would run an app (module:attr), what it expects to gain and what blocks more",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("target", help="module:attr of the app object (a chain, a query engine, ...)")
    parser.add_argument("--call", action="store_true", help="attr is a function that builds the app: call it first")
    parser.add_argument("--profiles", type=Path, default=None, help="a file of learned profiles to plan with")
    parser.add_argument("--expected-items", type=int, default=None, help="items a list-writing model writes")
    parser.add_argument("--png", type=Path, default=None, help="also draw each plan's graph as a PNG in this folder")
    parser.set_defaults(handler=run_explain)


def load(target: str) -> Any:
    """The object `module:attr` names (attr may be dotted)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(f"teola explain: expected module:attr (e.g. my_app.chains:chain), got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SystemExit(f"teola explain: {module_name} has no attribute {attr!r}") from None
    return obj


def run_explain(args: argparse.Namespace) -> int:
    import teola

    obj = load(args.target)
    if args.call:
        obj = obj()
    if callable(getattr(obj, "explain", None)):
        fast = obj
    else:
        options: dict[str, Any] = {"warn": False}
        if args.profiles is not None:
            options["profiles"] = args.profiles
        if args.expected_items is not None:
            options["expected_items"] = args.expected_items
        fast = teola.optimize(obj, **options)
    try:
        print(fast.explain(args.png) if args.png is not None else fast.explain())
    finally:
        close = getattr(fast, "close", None)
        if callable(close) and fast is not obj:
            close()
    return 0
