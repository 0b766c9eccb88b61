"""The completion board: completing takes no lock unless someone waits, and no wake-up is lost.

A lost wake-up shows as a wait that sleeps until its timeout although the task completed:
each test gives the waits a timeout far longer than the test needs and fails on it.
The interleavings that could lose a wake-up are forced by widening the gap between the two
reads involved (a list whose reads sleep), and searched by switching threads constantly.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, List

import pytest

from swpipeline.errors import DependencyTimeoutError, PipelineAborted
from swpipeline.signals import CompletionBoard


class SlowReads(list):  # type: ignore[type-arg]
    """A list whose reads from one thread sleep after reading: widens the gap before that thread's next step."""

    def __init__(self, values: List[int], slow_thread: threading.Thread, delay: float) -> None:
        super().__init__(values)
        self.slow_thread, self.delay = slow_thread, delay

    def __getitem__(self, index: Any) -> Any:
        value = super().__getitem__(index)
        if threading.current_thread() is self.slow_thread:
            time.sleep(self.delay)
        return value


def _complete_later(board: CompletionBoard, task: int, iteration: int, delay: float) -> threading.Thread:
    def complete() -> None:
        time.sleep(delay)
        board.complete(task, iteration)

    thread = threading.Thread(target=complete)
    thread.start()
    return thread


def test_complete_takes_no_lock_when_nobody_waits() -> None:
    board = CompletionBoard(["A", "B"])
    with board.lock:  # held by someone else: complete() must not need it
        board.complete(0, 0)
        board.complete(0, 1)
    assert board.done == [2, 0]
    assert board.unfinished(2) == ["A", "B"] and board.unfinished(1) == ["B"]


def test_a_waiter_that_registers_while_the_completer_is_between_its_two_steps_is_not_lost() -> None:
    # The completer is slow right after reading the waiter count (none yet): the waiter registers in that
    # gap. The counter was written before that read, so the waiter reads it and returns at once; a
    # completer that read the count before writing the counter would leave the waiter asleep.
    board = CompletionBoard(["A"])
    completer = threading.Thread(target=board.complete, args=(0, 0))
    board._waiters = SlowReads([0], completer, 0.05)
    completer.start()
    time.sleep(0.01)
    start = time.monotonic()
    board.wait_task(0, 0, 5.0, "B", 0)
    completer.join()
    assert board.done == [1]
    assert time.monotonic() - start < 1.0  # a lost wake-up would sleep the whole 5 s


def test_a_waiter_slow_between_registering_and_sleeping_is_woken() -> None:
    # The waiter registered and is slow to read the counter (holding the lock): the completer writes the
    # counter, sees the waiter and notifies it once it sleeps (the notify needs the lock the waiter holds).
    board = CompletionBoard(["A"])
    waiter_done: List[float] = []

    def wait() -> None:
        board.wait_task(0, 0, 5.0, "B", 0)
        waiter_done.append(time.monotonic())

    waiter = threading.Thread(target=wait)
    board.done = SlowReads([0], waiter, 0.05)
    waiter.start()
    time.sleep(0.01)  # the waiter is now inside its slow read, lock held
    start = time.monotonic()
    board.complete(0, 0)
    waiter.join()
    assert waiter_done and waiter_done[0] - start < 1.0


@pytest.mark.parametrize("waits_for", ["task", "iteration"])
def test_no_wake_up_is_lost_under_constant_thread_switches(waits_for: str) -> None:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        board = CompletionBoard(["A", "B"])
        rounds = 300

        def complete_all() -> None:
            for i in range(rounds):
                board.complete(0, i)
                board.complete(1, i)

        completer = threading.Thread(target=complete_all)
        completer.start()
        for i in range(rounds):
            if waits_for == "task":
                board.wait_task(1, i, 5.0, "C", i)
                assert board.done[1] > i
            else:
                assert board.wait_iteration(i, 5.0, lambda: False)
                assert board.is_iteration_done(i)
        completer.join()
    finally:
        sys.setswitchinterval(old)


def test_wait_iteration_waits_for_every_task_and_times_out_naming_nothing_done() -> None:
    board = CompletionBoard(["A", "B", "C"])
    board.complete(0, 0)
    board.complete(2, 0)
    assert not board.is_iteration_done(0)
    assert board.wait_iteration(0, 0.05, lambda: False) is False
    assert board.unfinished(0) == ["B"]
    thread = _complete_later(board, 1, 0, 0.02)
    assert board.wait_iteration(0, 5.0, lambda: False) is True
    thread.join()
    assert board.is_iteration_done(0) and not board.is_iteration_done(1)


def test_wait_iteration_returns_once_the_run_failed() -> None:
    board = CompletionBoard(["A"])
    failed: List[bool] = []

    def fail_later() -> None:
        time.sleep(0.02)
        failed.append(True)
        board.abort()  # a failure aborts the board, which wakes every waiter

    thread = threading.Thread(target=fail_later)
    thread.start()
    assert board.wait_iteration(0, 5.0, lambda: bool(failed)) is True
    thread.join()
    assert board.done == [0]


def test_wait_task_raises_on_abort_and_on_timeout() -> None:
    board = CompletionBoard(["A"])
    with pytest.raises(DependencyTimeoutError, match="'A'"):
        board.wait_task(0, 0, 0.02, "B", 0)
    thread = threading.Thread(target=lambda: (time.sleep(0.02), board.abort()))
    thread.start()
    with pytest.raises(PipelineAborted):
        board.wait_task(0, 0, 5.0, "B", 0)
    thread.join()
    assert board._waiters == [0]
