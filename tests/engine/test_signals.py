"""The completion board: completing takes no lock unless someone waits, and no wake-up is lost.

A lost wake-up shows as a wait that sleeps until its timeout although the task completed. The
interleavings that could lose one are forced, never left to timing: a hook on one of the board's
lists stops a thread right after a read, or tells the test the thread got there (a waiter that
reads the counter has registered and holds the lock until it sleeps), and the test makes the
other side act at that point. Each waiter runs on its own thread with a timeout far longer than
the test; one that has not returned ``BOUND`` seconds after its wake-up was due was not woken
(``Waiter.outcome``). The remaining interleavings are searched by switching threads constantly.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, List, Tuple

import pytest

from swpipeline.errors import DependencyTimeoutError, PipelineAborted
from swpipeline.engine import signals
from swpipeline.engine.signals import CompletionBoard, Turns

BOUND = 10.0  # seconds a forced step may take on a busy machine before the test fails (never reached when it passes)
NEVER = 600.0  # the waits' own timeout: a waiter back within BOUND was woken, it did not time out


class Checkpoint:
    """A point in one thread's run: ``reached`` is set when the thread gets there (once), ``seen`` says what it
    read there, and with ``hold`` it stays there until ``release()``."""

    def __init__(self, hold: bool = False) -> None:
        self.hold = hold
        self.reached, self._released = threading.Event(), threading.Event()
        self.seen: List[int] = []

    def __call__(self, value: int) -> None:
        if self.reached.is_set():
            return
        self.seen.append(value)
        self.reached.set()
        if self.hold and not self._released.wait(BOUND):
            raise RuntimeError(f"a thread held at a checkpoint was not released within {BOUND:g} s")

    def wait(self) -> None:
        assert self.reached.wait(BOUND), f"the thread did not reach its checkpoint within {BOUND:g} s"

    def release(self) -> None:
        self._released.set()


class OnRead(list):  # type: ignore[type-arg]
    """A list that calls ``checkpoint(value)`` after each read made by one thread (the board's counters are
    lists, read one item at a time)."""

    def __init__(self, values: List[int], thread: threading.Thread, checkpoint: Callable[[int], None]) -> None:
        super().__init__(values)
        self.thread, self.checkpoint = thread, checkpoint

    def __getitem__(self, index: Any) -> Any:
        value = super().__getitem__(index)
        if threading.current_thread() is self.thread:
            self.checkpoint(value)
        return value


class Waiter:
    """A wait run on a thread of its own (daemon: a lost one cannot keep the process alive)."""

    def __init__(self, board: CompletionBoard, wait: Callable[[], Any]) -> None:
        self.board = board
        self.result: List[Tuple[str, Any]] = []
        self.thread = threading.Thread(target=self._run, args=(wait,), name="waiter", daemon=True)

    def _run(self, wait: Callable[[], Any]) -> None:
        try:
            self.result.append(("returned", wait()))
        except Exception as exc:
            self.result.append(("raised", type(exc)))

    def start(self) -> "Waiter":
        self.thread.start()
        return self

    def outcome(self, woken_by: str) -> Tuple[str, Any]:
        """What the wait returned (or raised), once it returned: within BOUND, else its wake-up was lost."""
        self.thread.join(BOUND)
        if self.thread.is_alive():
            self.board.abort()  # wake it, so that it ends, before failing
            self.thread.join(BOUND)
            pytest.fail(f"lost wake-up: the waiter still slept {BOUND:g} s after {woken_by}")
        return self.result[0]


def test_complete_takes_no_lock_when_nobody_waits() -> None:
    board = CompletionBoard(["A", "B"])
    with board.lock:  # held by someone else: complete() must not need it
        board.complete(0, 0)
        board.complete(0, 1)
    assert board.done == [2, 0]
    assert board.unfinished(2) == ["A", "B"] and board.unfinished(1) == ["B"]


def test_a_waiter_that_registers_while_the_completer_is_between_its_two_steps_is_not_lost() -> None:
    # The completer is held right after reading the waiter count (none yet); the waiter registers in that gap.
    # Nobody will notify it (the completer saw no waiter), so it must find the counter written and return
    # while the completer is still held. A completer that read the count before writing the counter would
    # leave the waiter asleep.
    board = CompletionBoard(["A"])
    completer = threading.Thread(target=board.complete, args=(0, 0), name="completer")
    read_the_count = Checkpoint(hold=True)
    board.waiters = OnRead([0], completer, read_the_count)
    completer.start()
    try:
        read_the_count.wait()
        assert read_the_count.seen == [0] and board.done == [1]  # counter written, then no waiter seen
        waiter = Waiter(board, lambda: board.wait_task(0, 0, NEVER, "B", 0)).start()
        assert waiter.outcome("registering (the completer held, it cannot notify)") == ("returned", None)
        assert completer.is_alive()  # still held: the waiter returned without any notify
    finally:
        read_the_count.release()
        completer.join(BOUND)
    assert not completer.is_alive() and board.done == [1] and board.waiters == [0]


def test_a_waiter_slow_between_registering_and_sleeping_is_woken() -> None:
    # The waiter registered and is held right after reading the counter (0), holding the lock. The completer
    # writes the counter and sees the waiter; only then does the waiter go on to sleep. The completer's
    # notify needs the lock the waiter holds until it sleeps, so the notify comes after and wakes it.
    board = CompletionBoard(["A"])
    waiter = Waiter(board, lambda: board.wait_task(0, 0, NEVER, "B", 0))
    read_the_counter = Checkpoint(hold=True)
    board.done = OnRead([0], waiter.thread, read_the_counter)
    waiter.start()
    completer = threading.Thread(target=board.complete, args=(0, 0), name="completer")
    try:
        read_the_counter.wait()
        assert read_the_counter.seen == [0] and board.waiters == [1] and board.lock.locked()
        read_the_count = Checkpoint()
        board.waiters = OnRead([1], completer, read_the_count)
        completer.start()
        read_the_count.wait()
        assert read_the_count.seen == [1] and board.done == [1]  # counter written, the waiter seen: it notifies
    finally:
        read_the_counter.release()  # the waiter goes on to sleep, which lets the completer's notify in
    assert waiter.outcome("the completer saw it") == ("returned", None)
    completer.join(BOUND)
    assert not completer.is_alive() and board.waiters == [0]


@pytest.mark.parametrize("waits_for", ["task", "iteration"])
def test_no_wake_up_is_lost_under_constant_thread_switches(waits_for: str) -> None:
    # The completer completes round i only once the waiter has reached it, so every round races the
    # waiter's registering and reading against the completer's writing and reading, thread switches in between.
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        board = CompletionBoard(["A", "B"])
        rounds = 300
        reached = [-1]  # the round the waiter is in

        def wait_all() -> int:
            for i in range(rounds):
                reached[0] = i
                if waits_for == "task":
                    board.wait_task(1, i, NEVER, "C", i)
                    assert board.done[1] > i
                else:
                    assert board.wait_iteration(i, NEVER, lambda: board.aborted)
                    assert board.is_iteration_done(i)
            return rounds

        waiter = Waiter(board, wait_all).start()
        deadline = time.monotonic() + BOUND
        for i in range(rounds):
            while reached[0] < i and time.monotonic() < deadline:  # the waiter was woken for round i - 1
                time.sleep(0)  # (a yield)
            board.complete(0, i)
            board.complete(1, i)
        assert waiter.outcome(f"the completer completed round {reached[0]}") == ("returned", rounds)
    finally:
        sys.setswitchinterval(old)


def test_wait_iteration_waits_for_every_task_and_times_out_naming_nothing_done() -> None:
    board = CompletionBoard(["A", "B", "C"])
    board.complete(0, 0)
    board.complete(2, 0)
    assert not board.is_iteration_done(0)
    assert board.wait_iteration(0, 0.05, lambda: False) is False
    assert board.unfinished(0) == ["B"]
    # B completes while the waiter waits for it: failed() runs with the waiter registered on B and holding the
    # lock, just before it sleeps; complete() then needs that lock to notify, so it wakes a sleeping waiter.
    about_to_sleep = threading.Event()

    def failed() -> bool:
        about_to_sleep.set()
        return board.aborted

    waiter = Waiter(board, lambda: board.wait_iteration(0, NEVER, failed)).start()
    assert about_to_sleep.wait(BOUND)
    assert board.unfinished(0) == ["B"]
    board.complete(1, 0)
    assert waiter.outcome("B completed") == ("returned", True)
    assert board.is_iteration_done(0) and not board.is_iteration_done(1)


def test_wait_iteration_returns_once_the_run_failed() -> None:
    board = CompletionBoard(["A"])
    checked: List[bool] = []
    about_to_sleep = threading.Event()

    def failed() -> bool:  # checked with the waiter registered and holding the lock, before each sleep
        checked.append(board.aborted)
        about_to_sleep.set()
        return board.aborted

    waiter = Waiter(board, lambda: board.wait_iteration(0, NEVER, failed)).start()
    assert about_to_sleep.wait(BOUND)
    board.abort()  # a failure aborts the board, which wakes every waiter (once the waiter sleeps: the lock)
    assert waiter.outcome("the abort") == ("returned", True)
    assert checked == [False, True] and board.done == [0]


def test_wait_task_raises_on_abort_and_on_timeout() -> None:
    board = CompletionBoard(["A"])
    with pytest.raises(DependencyTimeoutError, match="'A'"):
        board.wait_task(0, 0, 0.02, "B", 0)
    waiter = Waiter(board, lambda: board.wait_task(0, 0, NEVER, "B", 0))
    read_the_counter = Checkpoint()  # registered, and holding the lock until it sleeps
    board.done = OnRead([0], waiter.thread, read_the_counter)
    waiter.start()
    read_the_counter.wait()
    board.abort()
    assert waiter.outcome("the abort") == ("raised", PipelineAborted)
    assert read_the_counter.seen == [0] and board.waiters == [0]


# -- turns: each waiting unit is woken alone ------------------------------------------------------------


def test_passing_a_turn_wakes_only_the_unit_whose_turn_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    # Units 1, 2, 3 sleep on three threads before unit 0 runs. Each pass wakes the next unit alone, so each
    # sleeper waits exactly once; waking every sleeper at each pass (notify_all) would make units 2 and 3
    # wake, find it is not their turn, and wait again (6 waits).
    waits: List[int] = []
    base = threading.Condition

    class Counting(base):  # type: ignore[misc, valid-type]
        def wait(self, timeout: Any = None) -> bool:
            if self._lock is lane._lock:  # the lane's sleepers only (Thread.start waits on a condition too)
                waits.append(threading.get_ident())
            return super().wait(timeout)

    lane = Turns("stream 'default'")
    monkeypatch.setattr(signals.threading, "Condition", Counting)
    for k in range(4):
        lane.assign((0, k), f"T(i{k})")
    ran: List[int] = []
    threads = [threading.Thread(target=lane.run_in_turn, args=((0, k), lambda k=k: ran.append(k), 5.0, "T", k))
               for k in (3, 2, 1)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while len(lane._sleepers) < 3 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(lane._sleepers) == 3
    lane.run_in_turn((0, 0), lambda: ran.append(0), 5.0, "T", 0)
    for t in threads:
        t.join(5)
    assert ran == [0, 1, 2, 3]
    assert len(waits) == 3 and len(set(waits)) == 3


def test_a_number_assigned_after_its_unit_sleeps_wakes_that_unit_and_abort_wakes_every_sleeper() -> None:
    lane = Turns("stream 'default'")
    ran: List[int] = []
    late = threading.Thread(target=lane.run_in_turn, args=((0, 0), lambda: ran.append(0), 5.0, "T", 0))
    late.start()
    deadline = time.monotonic() + 5
    while not lane._sleepers and time.monotonic() < deadline:
        time.sleep(0.001)
    lane.assign((0, 0), "T(i0)")  # its number comes after it started to wait, and it is its turn
    late.join(5)
    assert ran == [0] and not late.is_alive()
    errors: List[BaseException] = []

    def waiting(k: int) -> None:
        try:
            lane.run_in_turn((1, k), lambda: ran.append(k), 5.0, "U", k)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    sleepers = [threading.Thread(target=waiting, args=(k,)) for k in range(2)]  # never assigned
    for t in sleepers:
        t.start()
    while len(lane._sleepers) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    lane.abort()
    for t in sleepers:
        t.join(5)
    assert [type(e) for e in errors] == [PipelineAborted, PipelineAborted] and ran == [0]
