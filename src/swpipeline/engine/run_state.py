"""A run's life cycle and its first failure: one state machine under one lock.

Life cycle (``RunLife.state``, a ``RunState``), changed only through ``RunLife.move`` under
``RunLife.lock``, which refuses any transition not drawn here::

    running <--advance()------------- held      (progress(advance=False) retired an iteration;
       |    --progress(advance=False)-->  |       nothing is handed out until advance())
       |                                  |
       +--progress() found nothing left--> finished
       +--a task, the data iterator or the caller failed--> failed       (from held too)
       +--abandon(), or an exception leaving run() / a with block--> abandoned   (from held too)

The first failure of a running (or held) run is kept, under the same lock, and wakes
every thread waiting on the run (``abort``: the completion board and every turn). A
failure after it, or after the run stopped, is logged and dropped: once the run stopped
nothing is kept, since the exception's traceback holds frames that refer back to the
run (a worker's, through its report), a cycle only a garbage collection would free.
"""

from __future__ import annotations

import enum
import logging
import threading
from typing import Callable, List, NamedTuple, Optional, Sequence

from ..errors import DependencyTimeoutError, PipelineAborted, ProgressTimeoutError, SequencerTimeoutError, \
    annotate, stop_iteration_error
from .runtime import BoundTask
from .schedule import Work
from .signals import CompletionBoard, Turns

__all__: List[str] = []

logger = logging.getLogger("swpipeline")


class RunState(enum.Enum):
    """Where a run is in its life cycle (see the module docstring)."""

    RUNNING = "running"
    HELD = "held"
    FINISHED = "finished"
    FAILED = "failed"
    ABANDONED = "abandoned"


RUNNING, HELD, FINISHED, FAILED, ABANDONED = (RunState.RUNNING, RunState.HELD, RunState.FINISHED, RunState.FAILED,
                                              RunState.ABANDONED)
_MOVES = {RUNNING: {HELD, FINISHED, FAILED, ABANDONED}, HELD: {RUNNING, FAILED, ABANDONED},
          FINISHED: set(), FAILED: set(), ABANDONED: set()}


class Held(NamedTuple):
    """What ``progress(advance=False)`` held back: the iteration it retired, and whether its step draws a batch."""

    oldest: int
    draws: bool


def blocked_waits(board: CompletionBoard, tasks: Sequence[BoundTask], iter_idx: int) -> List[str]:
    """For each unfinished task of ``iter_idx``, the dependencies it is still missing."""
    done, names = board.done, board.names
    waits = []
    for task in tasks:
        if done[task.index] > iter_idx:
            continue
        missing = [f"{names[d]!r} (iteration {iter_idx})" for d, _ in task.intra if done[d] <= iter_idx]
        missing += [f"{names[d]!r} (iteration {iter_idx - back})" for d, _, back in task.inter
                    if 0 <= iter_idx - back and done[d] <= iter_idx - back]
        if missing:
            waits.append(f"{task.name!r} waits for {', '.join(missing)}")
    return waits


def progress_timeout_error(board: CompletionBoard, tasks: Sequence[BoundTask], oldest: int,
                           timeout: float) -> ProgressTimeoutError:
    """``progress()`` waited ``timeout`` for iteration ``oldest``: what is unfinished, and what each waits for."""
    return ProgressTimeoutError(oldest, board.unfinished(oldest), timeout, blocked_waits(board, tasks, oldest))


class RunLife:
    """One run's state and first failure (see the module docstring).

    Args:
        board, turns: what every waiting thread of the run waits on (woken by ``abort``).
        caller_timeout: for a wait of a unit on the caller's thread that outlasted the caller's
            shorter timeout, the ``ProgressTimeoutError`` to raise instead (None: the caller
            waits as long as a worker).
    """

    def __init__(self, board: CompletionBoard, turns: Sequence[Turns],
                 caller_timeout: Optional[Callable[[], ProgressTimeoutError]] = None) -> None:
        self.board, self.turns = board, turns
        self.caller_timeout = caller_timeout
        self.lock = threading.Lock()
        self.state = RUNNING
        self.held: Optional[Held] = None  # what advance() continues (state HELD only)
        self.error: Optional[BaseException] = None  # the first failure, until the run stops

    @property
    def active(self) -> bool:
        """Running or held: iterations may be in flight, workers are alive."""
        return self.state is RUNNING or self.state is HELD

    def move(self, state: RunState) -> bool:
        """Go to ``state`` if the life cycle allows it from here; False if the run has ended already (a stopped
        run stays as it ended). Any other transition is a bug, refused with a RuntimeError."""
        with self.lock:
            if state in _MOVES[self.state]:
                self.state = state
                return True
            if not self.active:
                return False
            raise RuntimeError(f"swpipeline: a run cannot go from {self.state.value} to {state.value} (a bug: "
                               f"please report it)")

    def hold(self, oldest: int, draws: bool) -> None:
        """``progress(advance=False)``: iteration ``oldest`` retired; nothing more is handed out until ``unhold``."""
        self.move(HELD)
        self.held = Held(oldest, draws)

    def unhold(self) -> Optional[Held]:
        """``advance()``: what the last ``hold`` kept (None if the run is not held)."""
        held, self.held = self.held, None
        if held is not None:
            self.move(RUNNING)
        return held

    # -- failure ---------------------------------------------------------------------------------

    def has_failed(self) -> bool:
        return self.error is not None or self.state is FAILED

    def record_failure(self, exc: BaseException) -> None:
        """Keep the first failure of a running run, and wake every thread waiting on it (module docstring)."""
        with self.lock:
            first = self.error is None and self.active
            again = exc is self.error
            if first:
                self.error = exc
        if not (first or again or isinstance(exc, PipelineAborted)):  # never dropped silently, never kept:
            logger.warning("swpipeline: a later failure after the run's first one (raised to the caller) or after "
                           "it stopped: %s", f"{type(exc).__name__}: {exc}")  # a log record holds only text
        self.abort()

    def forget_failure(self) -> None:
        """The run stopped: let go of its failure (its traceback holds the caller's frames)."""
        with self.lock:
            self.error = None

    def abort(self) -> None:
        """Every wait of this run raises PipelineAborted from now on; no worker starts another unit."""
        self.board.abort()
        for turns in self.turns:
            turns.abort()

    def on_worker_error(self, exc: BaseException, unit: Optional[Work]) -> None:
        """A unit (or a worker's start-up) raised: keep the first failure and wake everyone. Never raises."""
        try:
            if isinstance(exc, PipelineAborted):
                return
            if unit is not None:
                _, slot, ctx = unit
                name, it = slot.task, ctx.iter_idx
                if isinstance(exc, StopIteration):
                    exc = stop_iteration_error(exc, name, it)
                annotate(exc, name, it)
            elif isinstance(exc, StopIteration):
                error = RuntimeError("worker_init raised StopIteration")
                error.__cause__ = exc
                exc = error
            self.record_failure(exc)
        except BaseException:  # the last line: whatever happened above, the run must still fail
            self.record_failure(exc)

    def on_caller_error(self, exc: BaseException, unit: Optional[Work]) -> None:
        """A unit on the caller's thread raised. A wait of it that outlasted ``progress_timeout`` (shorter
        than ``signal_timeout``) is progress() waiting too long: a ProgressTimeoutError, as if the caller had
        waited for the oldest iteration itself, naming what blocks it."""
        if isinstance(exc, (DependencyTimeoutError, SequencerTimeoutError)) and self.caller_timeout is not None:
            timeout = self.caller_timeout()
            timeout.__cause__ = exc
            exc = timeout
        self.on_worker_error(exc, unit)
