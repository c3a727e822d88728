"""The `teola` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="teola", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
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
    args = parser.parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
