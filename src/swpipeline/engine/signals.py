"""Phase 1 of the two-phase protocol: CPU signals, plus iteration countdowns and abort.

Both classes here belong to one run (one ``fill_pipeline()``): a new run makes new
ones, so a thread of an earlier run can never complete, wake or abort anything of a
later run. Neither is ever reset.

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
* ``wait_iteration`` returns once every task of the iteration is done, and
  ``wait_units`` once each of the given units is, with the same timeout/abort behaviour.
* Completing takes no lock unless someone waits on the task: ``complete`` writes the
  counter, then reads the task's waiter count; a waiter raises that count (under the
  lock) before it reads the counter. Whatever the interleaving, either the waiter sees
  the new counter or the completer sees the waiter and notifies it under the lock, which
  the waiter holds until it sleeps. (Each step is one list access, atomic under the GIL.)
* An iteration is done when every task's counter has passed it: no per-iteration
  countdown to open, decrement or retire.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from ..errors import DependencyTimeoutError, PipelineAborted, SequencerTimeoutError

__all__: List[str] = []


class CompletionBoard:
    """Per-task completion counters, and waits on them, under one lock."""

    def __init__(self, task_names: List[str]) -> None:
        self.names = task_names
        self.lock = threading.Lock()
        # each task's condition, made by its first waiter (under the lock): most tasks are never waited on
        self._task_cond: List[Optional[threading.Condition]] = [None] * len(task_names)
        self.done: List[int] = [0] * len(task_names)
        # threads waiting on each task (changed under the lock only); the unit executor, which completes
        # most tasks, reads it itself to skip a call: ``done[task] = i + 1``, then ``wake`` if this is not 0
        self.waiters = [0] * len(task_names)
        self.aborted = False

    def complete(self, task: int, iter_idx: int) -> None:
        """Mark ``task`` done for ``iter_idx`` and wake whoever waits on it (see the module docstring)."""
        self.done[task] = iter_idx + 1
        if self.waiters[task]:
            self.wake(task)

    def wake(self, task: int) -> None:
        """Wake whoever waits on ``task`` (its counter was just raised)."""
        with self.lock:
            cond = self._task_cond[task]
            if cond is not None:
                cond.notify_all()

    def wait_task(self, task: int, iter_idx: int, timeout: float, waiter: str, waiter_iter: int) -> None:
        """Block until ``task`` is done for ``iter_idx`` (the caller checked the fast path)."""
        deadline = time.monotonic() + timeout
        with self.lock:
            cond = self._condition(task)
            self.waiters[task] += 1
            try:
                while self.done[task] <= iter_idx:
                    if self.aborted:
                        raise PipelineAborted()
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise DependencyTimeoutError(waiter, waiter_iter, self.names[task], iter_idx, timeout)
                    cond.wait(left)
            finally:
                self.waiters[task] -= 1

    def is_iteration_done(self, iter_idx: int) -> bool:
        return min(self.done) > iter_idx

    def wait_iteration(self, iter_idx: int, timeout: float, failed: Callable[[], bool]) -> bool:
        """Block until every task of ``iter_idx`` is done (True), ``failed()`` turns true, or time runs out.

        It waits for the tasks one after the other, in plan order, so the waiting thread is woken
        as the iteration's first tasks complete and its wake-up overlaps the rest of the work.
        (Waiting only for the task each thread runs last wakes it once, but after the work: on
        no-op tasks that measured 30% more time per task.)
        """
        return self.wait_units(((task, iter_idx) for task in range(len(self.done))), timeout, failed)

    def wait_units(self, units: Iterable[Tuple[int, int]], timeout: float, failed: Callable[[], bool]) -> bool:
        """Block until each ``(task, iteration)`` of ``units`` is done (True), ``failed()`` turns true, or time
        runs out (False), waiting for one unit after the other."""
        deadline = time.monotonic() + timeout
        done = self.done
        for task, iter_idx in units:
            if done[task] > iter_idx:
                continue
            with self.lock:
                cond = self._condition(task)
                self.waiters[task] += 1
                try:
                    while done[task] <= iter_idx:
                        if failed():
                            return True
                        left = deadline - time.monotonic()
                        if left <= 0:
                            return False
                        cond.wait(left)
                finally:
                    self.waiters[task] -= 1
        return True

    def _condition(self, task: int) -> threading.Condition:
        """``task``'s condition, made now if nobody waited on it before (called under the lock)."""
        cond = self._task_cond[task]
        if cond is None:
            cond = self._task_cond[task] = threading.Condition(self.lock)
        return cond

    def unfinished(self, iter_idx: int) -> List[str]:
        return [n for n, d in zip(self.names, self.done) if d <= iter_idx]

    def abort(self) -> None:
        """Wake every waiter; waits raise PipelineAborted from now on."""
        with self.lock:
            self.aborted = True
            for cond in self._task_cond:
                if cond is not None:
                    cond.notify_all()


Key = Tuple[int, int]  # (task index, iteration)


class Turns:
    """Units that must start in one pre-assigned order, whatever thread runs them.

    Two uses: the *sequencer* of globally ordered tasks (every rank assigns the same
    numbers, so collectives are issued in the same order on every rank), and each
    stream shared by several thread groups (its units start in the schedule's order,
    never in the order threads happen to reach it).

    The engine ``assign``s numbers to units in the schedule's order as soon as it knows
    which units exist (the clock-driven engine when it releases a period; the data-flow
    engine once the iterations of a period are known), possibly after the unit was
    handed to its worker; ``run_in_turn`` waits both for the unit's number and its turn.

    Each waiting unit sleeps on a condition of its own (over the one lock), and whoever
    makes a unit's turn come (the unit before it, ending; or the assignment of its
    number) wakes that unit alone. With ``notify_all`` every thread waiting on the stream
    woke at every turn, took the GIL and the lock, and slept again: on a stream shared by
    three thread groups that cost more than the tasks (``benchmarks/overhead.py``).
    A unit whose turn it already is runs without sleeping.
    """

    def __init__(self, what: str) -> None:
        self.what = what  # "the sequencer", or "stream 'default'": for messages
        self._lock = threading.Lock()
        self._numbers: Dict[Key, int] = {}  # assigned and not yet started
        self._keys: Dict[int, Key] = {}  # the same, by number
        self._holders: Dict[int, str] = {}
        self._sleepers: Dict[Key, threading.Condition] = {}  # units waiting for their turn
        self._conditions: Dict[int, threading.Condition] = {}  # one per thread that ever waited
        self._assigned = 0  # numbers handed out so far
        self._next = 0  # the number whose turn it is
        self.aborted = False

    def assign(self, key: Key, label: str) -> int:
        """Give ``key`` the next number; ``label`` names the unit in timeout messages."""
        with self._lock:
            number = self._assigned
            self._assigned = number + 1
            self._numbers[key] = number
            self._keys[number] = key
            self._holders[number] = label
            if number == self._next:
                sleeper = self._sleepers.get(key)
                if sleeper is not None:
                    sleeper.notify()
        return number

    def run_in_turn(self, key: Key, fn: Callable[[], None], timeout: float, task: str, iter_idx: int) -> None:
        """Wait until ``key`` has a number and it is its turn, run ``fn``, then pass the turn on."""
        with self._lock:
            number = self._numbers.get(key)
            if number is None or number != self._next:
                number = self._sleep_until_turn(key, timeout, task, iter_idx)
            del self._numbers[key]
            del self._keys[number]
        try:
            fn()
        finally:
            with self._lock:
                self._holders.pop(number, None)
                self._next = number + 1
                following = self._keys.get(number + 1)
                if following is not None:
                    sleeper = self._sleepers.get(following)
                    if sleeper is not None:
                        sleeper.notify()

    def _sleep_until_turn(self, key: Key, timeout: float, task: str, iter_idx: int) -> int:
        """Under the lock: sleep until ``key``'s number is assigned and its turn has come; return the number."""
        me = threading.get_ident()
        sleeper = self._conditions.get(me)
        if sleeper is None:
            sleeper = self._conditions[me] = threading.Condition(self._lock)
        self._sleepers[key] = sleeper
        deadline = time.monotonic() + timeout
        try:
            while True:
                number = self._numbers.get(key)
                if number is not None and number == self._next:
                    return number
                if self.aborted:
                    raise PipelineAborted()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SequencerTimeoutError(task, iter_idx, number, self._next, timeout,
                                                self._holders.get(self._next), self.what)
                sleeper.wait(left)
        finally:
            del self._sleepers[key]

    def abort(self) -> None:
        with self._lock:
            self.aborted = True
            for sleeper in self._sleepers.values():
                sleeper.notify()
