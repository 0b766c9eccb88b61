"""One worker thread per thread group, fed through a FIFO queue.

A queue item is a *batch* of work units that the worker runs in order: the
clock-driven engine puts one batch per thread group per period (one hand-off
between threads per period, not per task); the data-flow engine puts one unit at
a time. A worker never dies on an exception: it reports it through ``on_error``
and keeps consuming (skipping) items until it receives the stop sentinel, so the
thread that stops it can always join it.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import queue
import sys
import threading
from typing import Any, Callable, Deque, List, Sequence, Tuple, Union

__all__: List[str] = []

logger = logging.getLogger("swpipeline")

Unit = Tuple[Any, ...]
_STOP = object()
_PR_SET_NAME = 15  # linux/prctl.h


def name_os_thread(name: str) -> None:
    """Give the calling OS thread ``name`` (Linux; at most 15 bytes), so that profilers show it; best effort.

    Python names only its own ``threading.Thread`` object; the torch profiler's trace,
    ``top -H`` and py-spy read the OS thread name, which is otherwise ``python``.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Worker:
    """A thread that runs the units put to it, in order, until stopped."""

    def __init__(
        self,
        group: str,
        run_unit: Callable[..., None],
        on_error: Callable[[BaseException, Unit], None],
        is_aborted: Callable[[], bool],
        enter_thread: Callable[[], None],
    ) -> None:
        self.group = group
        self._queue: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._run_unit = run_unit
        self._on_error = on_error
        self._is_aborted = is_aborted
        self._enter_thread = enter_thread
        self._thread = threading.Thread(target=self._loop, name=f"swp-{group}", daemon=True)
        self._thread.start()

    def put(self, units: Sequence[Unit]) -> None:
        self._queue.put(units)

    def stop(self) -> None:
        self._queue.put(_STOP)

    def join(self, timeout: float) -> bool:
        """Join the thread; False if it is still alive after ``timeout`` (a task never returned)."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("worker thread %r did not stop within %.1f s (a task is still running)",
                           self._thread.name, timeout)
            return False
        return True

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        name_os_thread(self._thread.name)
        try:
            self._enter_thread()
        except BaseException as exc:  # report, then keep draining so the stopper can join us
            self._on_error(exc, ())
        get = self._queue.get
        run_unit = self._run_unit
        while True:
            units = get()
            if units is _STOP:
                return
            for unit in units:
                if self._is_aborted():
                    break
                try:
                    run_unit(*unit)
                except BaseException as exc:
                    self._on_error(exc, unit)
                    break


class InlineWorker:
    """A thread group whose units run on the thread that calls ``progress()``, not on a worker thread.

    Units queue up as for a ``Worker``; ``run_queued()`` runs them in order, stopping at
    the first failure (reported through ``on_error``) exactly as a worker thread does.
    """

    def __init__(self, group: str, run_unit: Callable[..., None],
                 on_error: Callable[[BaseException, Unit], None], is_aborted: Callable[[], bool]) -> None:
        self.group = group
        self._queue: Deque[Sequence[Unit]] = collections.deque()
        self._run_unit = run_unit
        self._on_error = on_error
        self._is_aborted = is_aborted

    def put(self, units: Sequence[Unit]) -> None:
        self._queue.append(units)

    def run_queued(self) -> None:
        queue = self._queue
        while queue:
            for unit in queue.popleft():
                if self._is_aborted():
                    queue.clear()
                    return
                try:
                    self._run_unit(*unit)
                except BaseException as exc:
                    self._on_error(exc, unit)
                    queue.clear()
                    return

    def stop(self) -> None:
        self._queue.clear()

    def join(self, timeout: float) -> bool:
        return True

    @property
    def alive(self) -> bool:
        return False


WorkerLike = Union[Worker, InlineWorker]
