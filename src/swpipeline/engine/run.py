"""One fill of a pipeline: everything execution touches, owned by that fill alone, made whole from its parts.

``fill_pipeline()`` makes a ``Run`` (``assemble.py`` builds it); the run has its own
completion board, turns (sequencer), device events and worker threads, and holds the
in-flight contexts. Nothing of it is reused by a later fill, so a thread that outlives
its run (a *straggler*: a task that did not return within the join budget) can only ever
touch its own, finished run. Its parts, each made before the run and knowing nothing of
the others or of the run::

    life      run_state.RunLife   the state machine (running, held, finished, failed,
                                  abandoned) and the first failure, under one lock
    feed      feed.Feed           the data iterator, the contexts in flight (its one owner)
    crew      crew.Crew           the workers, one per thread group; they report to life
    handout   handout.HandOut     the release rule applied to this run: draws through the
                                  feed, puts units on the crew's queues

What the run adds is what needs several parts at once: ``start``, ``retire_oldest`` (the
board, the device, the feed), ``wait_for_boundary`` (the step boundary) and ``stop``.

Every way out of ``running`` goes through ``stop``: abort (every waiting thread wakes
and every worker starts nothing more), ask each worker to end, and join them all
against one shared deadline. ``stop`` cannot be left half done: an interrupt that lands
while it runs is held back until the joins are over, then re-raised. A run is joined
once: stopping it again (``run()``'s handler and ``__exit__`` abandon a run that failed,
which stopped it already) joins nothing more, so a thread stuck in a task costs one
``join_timeout`` in total, whatever the path.

No reference cycles. A stopped run lets go of everything of the caller's it held: the
failure (whose traceback holds the frames that raised it, the caller's among them), the
contexts in flight (their batches), the data iterator, the hand-out of work and the units
its ended workers never ran; and its ended workers forget the run (``Worker.let_go``). A
failure recorded after the run stopped (a straggler's) is not kept. So the objects of a
run, finished or failed, are freed by reference counting as soon as it ends (a failed one:
as soon as the caller drops the exception), never by a later garbage collection, in which
a Ctrl-C could be lost and a data loader's worker processes linger, and which a loop of
many short runs would otherwise trigger often (``test_a_run_leaves_nothing_for_the_garbage_collector``).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional

from . import shutdown
from ..devices.device import Device
from ..errors import ProgressTimeoutError
from .crew import Crew
from .feed import Feed
from .handout import HandOut
from .modes import Modes
from .run_state import ABANDONED, FINISHED, RunLife, RunState, blocked_waits, progress_timeout_error
from .runtime import BoundTask
from .schedule import Work
from .signals import CompletionBoard
from .worker import Worker, WorkerLike

__all__: List[str] = []


class Run:
    """The state of one fill (see the module docstring)."""

    def __init__(self, life: RunLife, feed: Feed, crew: Crew, handout: HandOut, tasks: List[BoundTask],
                 board: CompletionBoard, device: Device, default_stream: Any, *, event_slots: int,
                 progress_timeout: float, join_timeout: float) -> None:
        self.life, self.feed, self.crew, self.handout = life, feed, crew, handout
        self.tasks = tasks  # bound to this run (its own device events)
        self.board = board
        self.device = device
        self.default_stream = default_stream  # the filling thread's stream: "default" tasks run on it
        self.event_slots = event_slots
        self.progress_timeout = progress_timeout
        self.join_timeout = join_timeout
        self._joined = False  # stop() joined the workers (it never does twice)
        self.stragglers: List[Worker] = []

    # -- what the pipeline reads ------------------------------------------------------------------

    @property
    def state(self) -> RunState:
        return self.life.state

    @property
    def active(self) -> bool:
        """Running or held: iterations may be in flight, workers are alive."""
        return self.life.active

    @property
    def emptied(self) -> bool:
        """``progress(None)`` retired the last iteration in flight before the data ended."""
        return self.life.state is FINISHED and not self.feed.exhausted

    @property
    def error(self) -> Optional[BaseException]:
        return self.life.error

    @property
    def workers(self) -> Dict[str, WorkerLike]:
        return self.crew.workers

    def worker_on(self, thread: threading.Thread) -> Optional[Worker]:
        """This run's worker whose thread is ``thread``, if any (``driving.Occupancy``)."""
        return self.crew.worker_on(thread)

    def caller_unit(self) -> Optional[Work]:
        """The unit of the caller's thread group that the driving thread is running, if any."""
        return self.crew.caller_unit()

    # -- starting, retiring, the step boundary (the caller's thread) ------------------------------

    def start(self, owner: object, modes: Optional[Modes]) -> None:
        """Start the workers (abandoning the run if ``owner``, its pipeline, is garbage-collected) and fill."""
        self.crew.start()
        self.crew.watch(owner, self.abandon_nowait)
        self.handout.fill(modes)

    def retire_oldest(self) -> int:
        """Wait for the oldest iteration in flight to complete and retire it; raise the run's failure if any."""
        oldest = self.feed.next_retire
        board, life = self.board, self.life
        if life.error is not None or not board.is_iteration_done(oldest):
            if not board.wait_iteration(oldest, self.progress_timeout, life.has_failed):
                raise progress_timeout_error(board, self.tasks, oldest, self.progress_timeout)
            if life.error is not None:
                raise life.error
        if self.device.uses_events:
            default = self.default_stream
            slot = oldest % self.event_slots
            for task in self.tasks:
                if task.waits_at_retire and task.events is not None:
                    self.device.wait(default, task.events[slot])
        feed = self.feed  # the caller has the context now, the run no longer
        feed.last_ctx = feed.contexts.pop(oldest)
        feed.next_retire = oldest + 1
        return oldest

    def wait_for_boundary(self) -> None:
        """Wait until every unit handed out that can run without more being handed out has (the step boundary,
        ``HandOut.boundary``); raise the run's failure if any, or ProgressTimeoutError naming what is left."""
        board, life = self.board, self.life
        targets = self.handout.boundary(self.feed.next_retire)
        pending = sorted(((task, it) for task, it in targets.items() if board.done[task] <= it),
                         key=lambda unit: (unit[1], unit[0]))
        if pending and not board.wait_units(pending, self.progress_timeout, life.has_failed):
            left = [(task, it) for task, it in pending if board.done[task] <= it]
            first = left[0][1]
            raise ProgressTimeoutError(first, [f"{board.names[task]} (iteration {it})" for task, it in left],
                                       self.progress_timeout, blocked_waits(board, self.tasks, first),
                                       waited_for="the units already handed out to finish at the step boundary")
        if life.error is not None:
            raise life.error

    # -- stopping --------------------------------------------------------------------------------

    def stop(self, state: RunState) -> List[Worker]:
        """Leave ``running`` for ``state``, stop and join every worker within one join budget; idempotent.

        Returns the stragglers: workers still alive when the budget ran out (a task that
        does not return). An interrupt arriving meanwhile is re-raised once all is joined.
        """
        pending: Optional[BaseException] = None
        deadline = time.monotonic() + self.join_timeout
        for _ in range(100):  # repeats only if an interrupt lands in the middle; every step is idempotent
            try:
                self.life.move(state)
                if self.life.state is not FINISHED:
                    self.life.abort()
                if not self._joined:
                    self.crew.join(deadline)
                    self._joined = True
                break
            except BaseException as exc:  # e.g. a second Ctrl-C: finish stopping first
                if pending is None:
                    pending = exc
        self.stragglers = self.crew.stragglers()
        self._let_go()
        if not self.stragglers:
            shutdown.forget(self)
        if pending is not None:
            try:
                raise pending
            finally:
                pending = None  # this frame is on its traceback: keeping it as a local would be a cycle
        return self.stragglers

    def _let_go(self) -> None:
        """Drop what a stopped run holds of the caller's (see "No reference cycles" above)."""
        self.life.forget_failure()
        self.life.held = None
        self.feed.let_go()
        self.handout.let_go()
        self.crew.let_go()

    def stop_at_exit(self, join_timeout: float) -> None:
        """The interpreter is exiting: abandon, joining the workers within ``join_timeout`` at most."""
        self.join_timeout = min(self.join_timeout, join_timeout)
        self.stop(ABANDONED)

    def threads_alive(self) -> bool:
        return self.crew.threads_alive()

    def abandon_nowait(self) -> None:
        """Abandon without joining (the pipeline is gone): wake everyone, ask every worker to end."""
        self.life.move(ABANDONED)
        self.life.abort()
        self.crew.ask_to_end()
