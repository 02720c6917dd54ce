"""The ``rayless`` console script. Subcommands parse arguments and call the packages."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from rayless import __version__

Command = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``rayless`` with every subcommand."""
    parser = argparse.ArgumentParser(prog="rayless", description=__doc__)
    parser.add_argument("--version", action="version", version=f"rayless {__version__}")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``rayless`` command line; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Command | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
