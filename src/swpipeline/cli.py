"""The swpipeline command line.

  swpipeline demo              train a small model serially and pipelined, and compare
  swpipeline plan TRACE.json   where a traced run's time went, and a faster plan for it
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, List, NoReturn, Optional

__all__: List[str] = []

INTERRUPTED = 130  # the shell's status for a command ended by Ctrl-C (128 + SIGINT)


class CommandParser(argparse.ArgumentParser):
    """argparse, with a bad option reported in one line (``swpipeline plan: error: argument --cores: ...``)
    and exit status 2, without the usage block: ``--help`` shows that."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def int_at_least(minimum: int, maximum: Optional[int] = None) -> Callable[[str], int]:
    """An argparse type: an int >= ``minimum`` (and <= ``maximum``)."""
    bounds = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer {bounds}, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be an integer {bounds}, got {value}")
        return value

    return parse


def name_list(what: str) -> Callable[[str], List[str]]:
    """An argparse type: one or more names separated by commas, each once (``default,prep``)."""

    def parse(text: str) -> List[str]:
        names = [name.strip() for name in text.split(",")]
        if not text.strip() or any(not name for name in names):
            raise argparse.ArgumentTypeError(f"must list {what} names separated by commas, e.g. default,prep; got "
                                             f"{text!r}")
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise argparse.ArgumentTypeError(f"lists {', '.join(twice)} more than once; name each {what} once")
        return names

    return parse


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command line; returns the exit status (130 when interrupted by Ctrl-C)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("swpipeline: interrupted", file=sys.stderr)
        return INTERRUPTED


def _main(argv: Optional[List[str]]) -> int:
    import torch

    from . import __version__

    parser = CommandParser(prog="swpipeline", description=__doc__, allow_abbrev=False,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"swpipeline {__version__} (torch {torch.__version__}, Python "
                                f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,plan}")
    from . import demo

    demo.add_arguments(sub.add_parser("demo", help="train a small recommendation model serially and pipelined",
                                      description=demo.COMMAND_HELP, allow_abbrev=False))
    from .planning import cli_plan

    cli_plan.add_arguments(sub.add_parser("plan", help="where a traced run's time went, and a faster plan for it",
                                          description=cli_plan.COMMAND_HELP, allow_abbrev=False,
                                          formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo.run(args)
    return cli_plan.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
