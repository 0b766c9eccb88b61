"""A with-block built from two plain functions, that never touches the exception leaving it."""

from __future__ import annotations

from typing import Any, Callable, Generic, List, TypeVar

__all__: List[str] = []

S = TypeVar("S")


class Scoped(Generic[S]):
    """A with-block that calls ``enter()`` and hands its result to ``leave`` at the end.

    A class rather than ``contextlib.contextmanager``: an exception leaving the block
    passes through untouched (a generator-based manager writes ``__traceback__`` onto
    it, which a frozen-dataclass exception refuses, replacing the user's exception).
    """

    def __init__(self, enter: Callable[[], S], leave: Callable[[S], None]) -> None:
        self._enter, self._leave = enter, leave

    def __enter__(self) -> None:
        self._saved = self._enter()

    def __exit__(self, *exc: Any) -> None:
        self._leave(self._saved)
