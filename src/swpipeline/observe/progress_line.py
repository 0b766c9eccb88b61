"""The progress display of ``run(verbose=True)`` and ``run_serial(verbose=True)``.

On a terminal it is one line, redrawn in place (``\\r``) at most five times a second.
Anywhere else (stderr sent to a log file or a pipe) a ``\\r`` would pile every redraw
into one long line, so it writes plain lines instead: one each time another tenth of
the iterations is done (every ``log_seconds`` when the total is unknown), and one at
the end::

    terminal:  SWPipeline: 120/200 iterations, 11.540 ms/iter      (the same line, redrawn)
    log file:  SWPipeline: 20/200 iterations, 11.610 ms/iter
               SWPipeline: 40/200 iterations, 11.552 ms/iter
               ...
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, List, Optional, TextIO

__all__: List[str] = []

REDRAW_SECONDS = 0.2  # a terminal's line is redrawn at most this often
LOG_FRACTION = 0.1  # elsewhere, a line each time this share of the total is done
LOG_SECONDS = 10.0  # elsewhere, with no known total, a line this often


class ProgressLine:
    """Progress on stderr (or ``stream``) for ``verbose=True`` runs: a redrawn line on a terminal, plain lines
    elsewhere (see the module docstring)."""

    def __init__(self, title: str, total: Optional[int], *, stream: Optional[TextIO] = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.title, self.total = title, total
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.terminal = _is_terminal(self.stream)
        self.start = self.last = clock()
        self.count = 0
        self.logged = 0  # the count of the last plain line written

    def step(self) -> None:
        self.count += 1
        now = self.clock()
        if self.terminal:
            if now - self.last >= REDRAW_SECONDS:
                self.last = now
                self._write(now, "\r", "")
        elif self._log_due(now):
            self.last, self.logged = now, self.count
            self._write(now, "", "\n")

    def close(self) -> None:
        now = self.clock()
        if self.terminal:
            self._write(now, "\r", "\n")
        elif self.logged != self.count or self.count == 0:
            self._write(now, "", "\n")

    def _log_due(self, now: float) -> bool:
        if self.total is not None and self.total > 0:
            step = max(1, int(self.total * LOG_FRACTION))
            return self.count % step == 0 or self.count == self.total
        return now - self.last >= LOG_SECONDS

    def _write(self, now: float, prefix: str, end: str) -> None:
        of = f"/{self.total}" if self.total is not None else ""
        per = (now - self.start) / self.count * 1e3 if self.count else 0.0
        self.stream.write(f"{prefix}{self.title}: {self.count}{of} iterations, {per:.3f} ms/iter{end}")
        self.stream.flush()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # a closed or stand-in stream
        return False


def len_or_none(data: Any) -> Optional[int]:
    try:
        return len(data)
    except TypeError:
        return None
