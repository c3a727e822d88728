"""The `teola` command: `teola demo`, `teola bench`, `teola serve`, `teola profile`, `teola explain`.

Every subcommand shows each option's default in its `--help`. Bad input ends with one line
naming what was wrong and a hint (exit status 2), never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from teola.cli_support import DefaultsFormatter, UsageError, fail


def build_parser() -> argparse.ArgumentParser:
    """The `teola` parser with every subcommand registered."""
    parser = argparse.ArgumentParser(prog="teola", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    from teola_benchmarks.cli import add_bench_command

    add_bench_command(commands)
    from teola.demo.cli import add_demo_command

    add_demo_command(commands)
    from teola.server.cli import add_serve_command

    add_serve_command(commands)
    from teola.profiling import add_profile_command

    add_profile_command(commands)
    from teola.explaining import add_explain_command

    add_explain_command(commands)
    for command in commands.choices.values():  # every option's default in its help
        command.formatter_class = DefaultsFormatter
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from teola_adapters._optional import MissingDependencyError

    try:
        return int(args.handler(args) or 0)
    except UsageError as exc:
        return fail(f"teola {args.command}: {exc}", exc.hint)
    except MissingDependencyError as exc:
        return fail(f"teola {args.command}: {exc}")


if __name__ == "__main__":
    sys.exit(main())
