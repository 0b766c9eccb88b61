"""The ``swpipeline`` command line: ``swpipeline demo`` runs the main job; ``swpipeline plan TRACE.json``
shows where a traced run's time went and suggests a faster plan."""

from __future__ import annotations

import argparse
from typing import List, Optional

__all__: List[str] = []


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="swpipeline", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    from . import demo

    demo.add_arguments(sub.add_parser("demo", help="train a small recommendation model serially and pipelined"))
    from .planning import cli_plan

    cli_plan.add_arguments(sub.add_parser("plan", help="where a traced run's time went, and a faster plan for it",
                                          description=cli_plan.__doc__,
                                          formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo.run(args)
    if args.command == "plan":
        return cli_plan.run(args)
    parser.error(f"unknown command {args.command!r}")


if __name__ == "__main__":
    raise SystemExit(main())
