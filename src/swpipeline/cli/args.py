"""What the commands of ``swpipeline`` share to read their arguments: the parser, and two argument types.

A leaf: it imports nothing of swpipeline, so the dispatcher (``cli/__init__.py``) and every command
(``demo/command.py``, ``plan_command.py``) can import it without an import circle.
"""

from __future__ import annotations

import argparse
from typing import Callable, List, NoReturn, Optional

__all__: List[str] = []


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
