"""Deadlines for the waits on other ranks, kept by one thread, so that a silent rank is reported before gloo's own
timeout closes every connection of the waiting rank.

On gloo a receive that times out closes all of the rank's connections, after which it
can tell nobody why it failed. So a receive waits ``timeout + grace`` seconds and
registers a deadline at ``timeout`` here: when that passes first, the watchdog calls the
receive's ``on_expiry`` (which sends the failure to every other rank while the
connections still work), then the receive's own wait ends at ``timeout + grace``::

    wait starts ------------------ timeout ---------- timeout + grace
                                   on_expiry()        the receive fails (gloo closes the connections)

The thread is started by the first deadline and ends when the ``Watchdog`` is dropped;
between deadlines it sleeps on a condition, so a wait costs a lock and a heap entry (the entries
of waits that ended are dropped from time to time, so the heap stays as small as the waits).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import weakref
from typing import Callable, Dict, List, Optional, Tuple

__all__: List[str] = []

Expiry = Callable[[], None]


class _Deadlines:
    """What the watchdog thread reads: the pending deadlines, under one condition (no reference to the owner)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.heap: List[Tuple[float, int]] = []
        self.pending: Dict[int, Expiry] = {}
        self.stopped = False

    def run(self) -> None:
        while True:
            with self.cond:
                while not self.stopped and (not self.heap or self.heap[0][0] > time.monotonic()):
                    while self.heap and self.heap[0][1] not in self.pending:  # done before its deadline
                        heapq.heappop(self.heap)
                    wait = self.heap[0][0] - time.monotonic() if self.heap else None
                    self.cond.wait(wait)
                if self.stopped:
                    return
                _, token = heapq.heappop(self.heap)
                expiry = self.pending.pop(token, None)
            if expiry is not None:
                try:
                    expiry()
                except Exception:  # a failing report must not end the watchdog
                    pass

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify()


class Watchdog:
    """Calls ``on_expiry`` of each wait that is still pending at its deadline (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._deadlines = _Deadlines()
        self._thread: Optional[threading.Thread] = None
        self._tokens = itertools.count()
        weakref.finalize(self, self._deadlines.stop)

    def watch(self, seconds: float, on_expiry: Expiry) -> int:
        """Register a deadline ``seconds`` from now; returns the token to pass to ``done``."""
        token = next(self._tokens)
        deadline = time.monotonic() + seconds
        state = self._deadlines
        with state.cond:
            state.pending[token] = on_expiry
            if len(state.heap) > 2 * len(state.pending) + 64:  # drop the entries of waits that ended
                state.heap = [entry for entry in state.heap if entry[1] in state.pending]
                heapq.heapify(state.heap)
            heapq.heappush(state.heap, (deadline, token))
            if state.heap[0][1] == token:
                state.cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=state.run, name=self._name, daemon=True)
                self._thread.start()
        return token

    def done(self, token: int) -> None:
        """The wait ended before its deadline."""
        with self._deadlines.cond:
            self._deadlines.pending.pop(token, None)
