"""The ``swpipeline`` command line: ``swpipeline demo`` runs the main job."""

from __future__ import annotations

import argparse
from typing import List, Optional

__all__: List[str] = []


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="swpipeline", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    from . import demo

    demo.add_arguments(sub.add_parser("demo", help="train a small recommendation model serially and pipelined"))
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo.run(args)
    parser.error(f"unknown command {args.command!r}")


if __name__ == "__main__":
    raise SystemExit(main())
