"""Phase 1 of the two-phase protocol: CPU signals, plus iteration countdowns and abort.

A CPU signal says "task T has finished (host side, events recorded) iteration i".
Every task finishes its iterations in increasing order (it runs on one worker
thread, which receives them in order), so one counter per task is a complete
record: ``done[T] = i + 1`` after ``T(i)``, and ``T(i)`` is done iff ``done[T] > i``.
Unlike a ring of per-slot events, a counter needs no reset, so a slow consumer of
iteration i can never see the slot already reused by iteration i + depth.

Guarantees:

* ``wait_task`` returns only once the dependency is done; it raises
  ``DependencyTimeoutError`` after ``timeout`` seconds, and ``PipelineAborted`` as
  soon as ``abort()`` is called, so no thread waits on a failed pipeline.
* ``wait_iteration`` returns once every task of the iteration is done, with the
  same timeout/abort behaviour.
* Fast paths read a list element without the lock (atomic under the GIL); all
  writes and every slow-path check happen under the single lock.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Dict, List, Optional

from .errors import DependencyTimeoutError, PipelineAborted, SequencerTimeoutError

__all__: List[str] = []


class CompletionBoard:
    """Per-task completion counters and per-iteration countdowns, under one lock."""

    def __init__(self, task_names: List[str]) -> None:
        self.names = task_names
        self.lock = threading.Lock()
        self._task_cond = [threading.Condition(self.lock) for _ in task_names]
        self._iter_cond = threading.Condition(self.lock)
        self.done: List[int] = [0] * len(task_names)
        self._waiters = [0] * len(task_names)  # threads in wait_task, per task (notify only if any)
        self._iter_waiter = False
        self._remaining: Dict[int, int] = {}
        self.aborted = False

    def reset(self) -> None:
        with self.lock:
            self.done = [0] * len(self.names)
            self._remaining.clear()
            self.aborted = False

    def open_iteration(self, iter_idx: int, num_tasks: int) -> None:
        with self.lock:
            self._remaining[iter_idx] = num_tasks

    def complete(self, task: int, iter_idx: int) -> None:
        """Mark ``task`` done for ``iter_idx`` and wake whoever waits on it."""
        with self.lock:
            self.done[task] = iter_idx + 1
            if self._waiters[task]:
                self._task_cond[task].notify_all()
            left = self._remaining[iter_idx] - 1
            self._remaining[iter_idx] = left
            if left == 0 and self._iter_waiter:
                self._iter_cond.notify_all()

    def wait_task(self, task: int, iter_idx: int, timeout: float, waiter: str, waiter_iter: int) -> None:
        """Block until ``task`` is done for ``iter_idx`` (the caller checked the fast path)."""
        deadline = time.monotonic() + timeout
        cond = self._task_cond[task]
        with self.lock:
            self._waiters[task] += 1
            try:
                while self.done[task] <= iter_idx:
                    if self.aborted:
                        raise PipelineAborted()
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise DependencyTimeoutError(waiter, waiter_iter, self.names[task], iter_idx, timeout)
                    cond.wait(left)
            finally:
                self._waiters[task] -= 1

    def is_iteration_done(self, iter_idx: int) -> bool:
        return self._remaining.get(iter_idx, 0) == 0

    def wait_iteration(self, iter_idx: int, timeout: float, failed: Callable[[], bool]) -> bool:
        """Block until every task of ``iter_idx`` is done (True), ``failed()`` turns true, or time runs out."""
        deadline = time.monotonic() + timeout
        with self.lock:
            self._iter_waiter = True  # only the thread calling progress() waits here
            try:
                while self._remaining[iter_idx] > 0 and not failed():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._iter_cond.wait(left)
            finally:
                self._iter_waiter = False
        return True

    def retire(self, iter_idx: int) -> None:
        with self.lock:
            del self._remaining[iter_idx]

    def unfinished(self, iter_idx: int) -> List[str]:
        return [n for n, d in zip(self.names, self.done) if d <= iter_idx]

    def abort(self) -> None:
        """Wake every waiter; waits raise PipelineAborted from now on."""
        with self.lock:
            self.aborted = True
            for cond in self._task_cond:
                cond.notify_all()
            self._iter_cond.notify_all()


class SubmissionSequencer:
    """Lets globally ordered tasks run in one pre-assigned sequence, whatever thread they are on.

    Every rank assigns the same numbers (they follow the enqueue order), so
    collectives are issued in the same order on every rank.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next_seq = 0
        self._holders: Dict[int, str] = {}
        self.aborted = False

    def reset(self) -> None:
        with self._cond:
            self._next_seq = 0
            self._holders.clear()
            self.aborted = False

    def announce(self, seq: int, task: str) -> None:
        """Record which task owns ``seq`` (for timeout messages)."""
        self._holders[seq] = task

    def execute_ordered(self, seq: int, fn: Callable[[], None], timeout: float = 30.0,
                        task: str = "?", iter_idx: int = -1) -> None:
        """Wait until it is ``seq``'s turn, run ``fn``, then pass the turn on."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._next_seq != seq:
                if self.aborted:
                    raise PipelineAborted()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SequencerTimeoutError(task, iter_idx, seq, self._next_seq, timeout,
                                                self._holders.get(self._next_seq))
                self._cond.wait(left)
        try:
            fn()
        finally:
            with self._cond:
                self._holders.pop(seq, None)
                self._next_seq = seq + 1
                self._cond.notify_all()

    def abort(self) -> None:
        with self._cond:
            self.aborted = True
            self._cond.notify_all()

    @property
    def next_seq(self) -> Optional[int]:
        return self._next_seq
