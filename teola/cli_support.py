"""What the `teola` subcommands share: checked argument types, one-line errors, progress rows.

p.add_argument("--questions", type=bounded_int(1, 8), default=4, help="...")
return fail("teola demo needs the extras local", 'pip install -e ".[local]"')   # exit 2
with Progress(*progress_columns()) as bar: ...
with working("running 7 systems"): result = slow()       # a spinner with the elapsed time
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that ends each option's text with its default, unless the text already names it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if not action.option_strings or "default" in text or action.default is argparse.SUPPRESS:
            return text
        if action.default is None:
            return f"{text} (default: none)"
        if action.default is False and action.nargs == 0:
            return f"{text} (default: off)"
        return f"{text} (default: %(default)s)"


def add_command(commands: Any, name: str, help: str, doc: str | None) -> argparse.ArgumentParser:
    """A `teola` subcommand: its description is the first paragraph of `doc` (its module's
    docstring), each option's help ends with its default (`DefaultsFormatter`)."""
    return commands.add_parser(
        name, help=help, description=doc.split("\n\n")[0] if doc else None, formatter_class=DefaultsFormatter
    )


class UsageError(Exception):
    """Bad input to a command: printed as one line with a hint, exit status 2 (no traceback)."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def fail(message: str, hint: str | None = None) -> int:
    """Print `message` (and `hint`) as one line on stderr; the exit status 2."""
    print(f"{message}{f' (hint: {hint})' if hint else ''}", file=sys.stderr)
    return 2


def bounded_int(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer from `low` to `high` (argparse prints the message)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low or (high is not None and value > high):
            bounds = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"{value} is out of range: give a number {bounds}")
        return value

    parse.__name__ = "integer"
    return parse


def positive_float(text: str) -> float:
    """An argparse type: a number above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value:g} must be above zero")
    return value


def progress_columns() -> tuple[Any, ...]:
    """A phase's name, a bar (a spinner while the total is unknown), done/total, the time it took."""
    from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn

    return (
        SpinnerColumn(finished_text="[green]✓"),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )


@contextmanager
def working(what: str, *, total: int | None = None) -> Iterator[Callable[[int], None]]:
    """A progress row on stderr while the block runs; yields `advance(n)` for counted work."""
    from rich.console import Console
    from rich.progress import Progress

    with Progress(*progress_columns(), console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(what, total=total)
        yield lambda n=1: bar.advance(task, n)
        done = bar.tasks[task].total or 1
        bar.update(task, total=done, completed=done)
