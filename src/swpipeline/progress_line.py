"""The one-line progress display of ``run(verbose=True)`` and ``run_serial(verbose=True)``."""

from __future__ import annotations

import sys
import time
from typing import Any, List, Optional

__all__: List[str] = []


class ProgressLine:
    """A one-line progress display on stderr for ``verbose=True`` runs."""

    def __init__(self, title: str, total: Optional[int]) -> None:
        self.title, self.total = title, total
        self.start = self.last = time.perf_counter()
        self.count = 0

    def step(self) -> None:
        self.count += 1
        now = time.perf_counter()
        if now - self.last >= 0.2:
            self.last = now
            self._draw(now, "\r")

    def close(self) -> None:
        self._draw(time.perf_counter(), "\r")
        sys.stderr.write("\n")

    def _draw(self, now: float, prefix: str) -> None:
        of = f"/{self.total}" if self.total is not None else ""
        per = (now - self.start) / self.count * 1e3 if self.count else 0.0
        sys.stderr.write(f"{prefix}{self.title}: {self.count}{of} iterations, {per:.3f} ms/iter")
        sys.stderr.flush()


def len_or_none(data: Any) -> Optional[int]:
    try:
        return len(data)
    except TypeError:
        return None
