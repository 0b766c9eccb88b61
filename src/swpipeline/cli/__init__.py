"""The swpipeline command line.

  swpipeline demo              train a small model serially and pipelined, and compare
  swpipeline plan TRACE.json   where a traced run's time went, and a faster plan for it
"""

# This folder: a thin dispatcher (here), the argument helpers both commands share (args.py),
# swpipeline plan (plan_command.py) and swpipeline demo (demo/). May import anything below it.


from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from .args import CommandParser

__all__: List[str] = []

INTERRUPTED = 130  # the shell's status for a command ended by Ctrl-C (128 + SIGINT)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command line; returns the exit status (130 when interrupted by Ctrl-C)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("swpipeline: interrupted", file=sys.stderr)
        return INTERRUPTED


def _main(argv: Optional[List[str]]) -> int:
    """Parse ``argv`` and hand it to its command's ``run``; each command adds its own options."""
    import torch

    from ..version import __version__
    from .demo import command as demo
    from . import plan_command as plan

    parser = CommandParser(prog="swpipeline", description=__doc__, allow_abbrev=False,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"swpipeline {__version__} (torch {torch.__version__}, Python "
                                f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,plan}")
    demo.add_arguments(sub.add_parser("demo", help="train a small recommendation model serially and pipelined",
                                      description=demo.COMMAND_HELP, allow_abbrev=False))
    plan.add_arguments(sub.add_parser("plan", help="where a traced run's time went, and a faster plan for it",
                                      description=plan.COMMAND_HELP, allow_abbrev=False,
                                      formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    run = demo.run if args.command == "demo" else plan.run
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
