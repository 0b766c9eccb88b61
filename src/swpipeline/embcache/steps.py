"""Which batches' training steps are in the model, and when the next one may start.

A pipeline step trains one batch with six tasks (``ZeroGrad`` ... ``DenseStep``). Two
rules keep the count of trained batches exact, whatever stops a run (``reset()``, a
failure in any task, a Ctrl-C):

* **A step starts only when the caller asks for its output.** The training tasks run
  on the thread that calls ``progress()``, inside that call, for the oldest batch only
  (the engines' ``caller_thread_group``), so between calls nothing trains and
  ``reset()`` drops the batches in flight untrained. Where an engine cannot run them on
  the caller's thread (the data-flow engine with ``max_depth`` below the plan's depth)
  they run on a worker behind a ``TrainGate``, which ``progress()`` opens for the batch
  it is about to return.
* **A step is whole or absent.** Its updates land in two tasks, ``SparseUpdate`` (the
  tables) and then ``DenseStep`` (the dense optimizer), and an engine stops a run between
  tasks. The ``StepLedger`` records, per batch, that the tables' rows were written (under
  a held Ctrl-C, so that the rows of every table and the record go together) and whether
  the dense step began. When a run ends, ``settle`` completes a batch whose tables were
  updated but whose dense step never started (it runs that step, once), so the model
  holds whole steps and ``completed`` counts them.

Waiting at the gate: the gated task waits for the caller, which may take any time
between calls, so the wait has no timeout of its own; it ends as soon as the batch is
admitted, the gate is closed (the run ended: ``reset()``, a failure, the end of the
data) or the engine's run stopped (checked every ``POLL_S`` seconds, for the stops
that reach the engine before this package hears of them: a timeout, a Ctrl-C inside
the engine, interpreter exit, a pipeline garbage-collected mid-run). It then raises
``PipelineAborted``, which a worker takes as "the run is over" and which never
replaces the run's own failure.

Why the gate cannot deadlock: ``progress()`` admits the oldest batch in flight before
it waits for that batch, so only later batches' training tasks can be held. Every
unit of the oldest batch comes before those in its thread group's order and in every
turn order (they are of earlier periods), and waits only for units earlier still (the
engines' own argument, ``clocked.py``, ``dataflow.py``); so nothing the caller waits
for waits for a held task.
"""

from __future__ import annotations

import threading
from typing import Callable, List

from ..errors import PipelineAborted
from ..engine.worker import held_interrupts

__all__: List[str] = []

POLL_S = 0.05  # how often a gated task checks that the engine's run is still going


class StepLedger:
    """The training steps whole in the model (``completed``), across every run of one pipeline."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.completed = 0
        self._updated = False  # the current step's tables were written; its dense step is to come
        self._dense_started = False
        self._sealed = False  # the run ended: no dense step may start any more (settle decided)

    def open(self) -> None:
        """A run starts: steps may begin again."""
        with self.lock:
            self._sealed = False

    def write_tables(self, write: Callable[[], None]) -> None:
        """Run ``write`` (every table's rows of this step) and record it, as one piece under a held Ctrl-C."""
        with held_interrupts():
            write()
            with self.lock:
                self._updated, self._dense_started = True, False

    def begin_dense_step(self) -> None:
        """The dense step is about to run.

        Raises:
            PipelineAborted: the run was settled meanwhile (``settle`` ran or will run this step itself).
        """
        with self.lock:
            if self._sealed:
                raise PipelineAborted()
            self._dense_started = True

    def end_step(self) -> None:
        """The step's dense step ran: the whole step is in the model."""
        with self.lock:
            if self._updated:
                self.completed += 1
            self._updated = self._dense_started = False

    def settle(self, dense_step: Callable[[], None]) -> None:
        """The run is over: make the last step whole (``dense_step()`` if the tables have it but it never began).

        A step whose dense step began and did not end (it failed, or was interrupted) counts
        as done: its tables were updated, and the dense optimizer is as its step left it.
        """
        with self.lock:
            self._sealed = True
            pending, started = self._updated, self._dense_started
        try:
            if pending and not started:
                dense_step()
        finally:  # counted even if that step fails: the tables hold it
            with self.lock:
                if pending:
                    self.completed += 1
                self._updated = self._dense_started = False


class TrainGate:
    """Holds a worker's training tasks until ``progress()`` admits their batch (see the module docstring).

    Args:
        run_over: whether the engine's run has stopped (checked while waiting).
    """

    def __init__(self, run_over: Callable[[], bool]) -> None:
        self._cond = threading.Condition()
        self._admitted = 0  # batches (run-relative iteration numbers) below this may train
        self._closed = False
        self._run_over = run_over
        self.waiting = 0  # tasks waiting at the gate now (for tests and debugging)

    def admit(self, iteration: int) -> None:
        """Let batch ``iteration`` (and every earlier one) train."""
        with self._cond:
            if iteration >= self._admitted:
                self._admitted = iteration + 1
                self._cond.notify_all()

    def close(self) -> None:
        """The run ended: every waiting task gives up, and none trains any more."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def wait(self, iteration: int) -> None:
        """Return once batch ``iteration`` is admitted.

        Raises:
            PipelineAborted: the gate was closed or the engine's run stopped first.
        """
        if iteration < self._admitted and not self._closed:
            return
        with self._cond:
            self.waiting += 1
            try:
                while iteration >= self._admitted or self._closed:
                    if self._closed or self._run_over():
                        raise PipelineAborted()
                    self._cond.wait(POLL_S)
            finally:
                self.waiting -= 1
