"""One fill of a pipeline: everything execution touches, owned by that fill alone.

``fill_pipeline()`` makes a ``Run``; the run has its own completion board, turns
(sequencer), device events and worker threads, and holds the in-flight contexts. Nothing of it is
reused by a later fill, so a thread that outlives its run (a *straggler*: a task that
did not return within the join budget) can only ever touch its own, finished run.

Life cycle (``Run.state``, a ``RunState``), changed only through ``Run.move`` under
``Run.lock``, which refuses any transition not drawn here::

    running <--advance()------------- held      (progress(advance=False) retired an iteration;
       |    --progress(advance=False)-->  |       nothing is handed out until advance())
       |                                  |
       +--progress() found nothing left--> finished
       +--a task, the data iterator or the caller failed--> failed       (from held too)
       +--abandon(), or an exception leaving run() / a with block--> abandoned   (from held too)

Every way out of ``running`` goes through ``stop``: abort (every waiting thread wakes
and every worker starts nothing more), ask each worker to end, and join them all
against one shared deadline. ``stop`` cannot be left half done: an interrupt that lands
while it runs is held back until the joins are over, then re-raised. A run is joined
once: stopping it again (``run()``'s handler and ``__exit__`` abandon a run that failed,
which stopped it already) joins nothing more, so a thread stuck in a task costs one
``join_timeout`` in total, whatever the path.

No reference cycles on the failure path. A stopped run lets go of everything of the
caller's it held: the failure (whose traceback holds the frames that raised it, the
caller's among them), the contexts in flight (their batches), the data iterator, the
hand-out of work and the units its ended workers never ran. A failure recorded after
the run stopped (a straggler's) is not kept. So the objects of a failed run are freed by
reference counting as soon as the caller drops the exception, never by a later garbage
collection, in which a Ctrl-C could be lost and a data loader's worker processes linger.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional

from typing import TYPE_CHECKING

from . import shutdown
from ..devices.device import Device
from ..errors import (DependencyTimeoutError, PipelineAborted, ProgressTimeoutError, SequencerTimeoutError, add_note,
                     annotate, stop_iteration_error)
from .modes import Modes
from ..plan.model import IterContext
from .runtime import BoundTask, all_turns
from .signals import CompletionBoard
from .driving import unit_text
from .schedule import Work
from .worker import CallerWorker, RunBatches, Worker, WorkerLike

if TYPE_CHECKING:
    from .handout import HandOut

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
    """What ``progress(advance=False)`` held back: the iteration it retired, and where ``advance()`` draws from."""

    oldest: int
    data_iter: Optional[Iterator[Any]]


class Run:
    """The state of one fill (see the module docstring)."""

    def __init__(self, tasks: List[BoundTask], device: Device, event_slots: int, *, progress_timeout: float,
                 join_timeout: float, default_stream: Any, signal_timeout: float) -> None:
        self.tasks = tasks  # bound to this run (its own device events)
        self.device = device
        self.default_stream = default_stream  # the filling thread's stream: "default" tasks run on it
        self.event_slots = event_slots
        self.progress_timeout = progress_timeout
        self.signal_timeout = signal_timeout
        # a unit on the caller's thread is part of a progress() call, which waits progress_timeout at most
        self.caller_timeout = min(signal_timeout, progress_timeout)
        self.join_timeout = join_timeout
        self.board = CompletionBoard([t.name for t in tasks])
        self.turns = all_turns(tasks)  # the sequencer and the shared streams' turns, if any
        self.lock = threading.Lock()
        self.state = RUNNING
        self.held: Optional[Held] = None  # what advance() continues (state HELD only)
        self.error: Optional[BaseException] = None  # the first failure, until the run stops
        self._joined = False  # stop() joined the workers (it never does twice)
        self.workers: Dict[str, WorkerLike] = {}
        self.caller: Optional[CallerWorker] = None
        self.stragglers: List[Worker] = []
        self.contexts: Dict[int, IterContext] = {}
        self.next_retire = 0
        self.num_created = 0
        self.exhausted = False  # the data iterator raised StopIteration
        self.last_ctx: Optional[IterContext] = None
        self.peak_live_contexts = 0
        self.data_source: Optional[Iterator[Any]] = None  # the data iterator progress() last accepted
        self.handout: "HandOut"  # what hands out this run's work (handout.py); set as the run starts
        self.modes: Optional[Modes] = None  # the torch modes of the driving call handing out work (modes.py)
        # On a device with events, per event slot: the event recorded on the stream the caller drew that
        # iteration's batch on, and that stream (None: no task needs to wait for it); see fetch().
        # The events are made when first needed.
        self._batch_roots = list({id(t.stream): t.stream for t in tasks if t.waits_batch}.values())
        self.batch_events: List[Any] = []
        self.batch_streams: List[Any] = [None] * event_slots

    @property
    def active(self) -> bool:
        """Running or held: iterations may be in flight, workers are alive."""
        return self.state is RUNNING or self.state is HELD

    @property
    def emptied(self) -> bool:
        """``progress(None)`` retired the last iteration in flight before the data ended."""
        return self.state is FINISHED and not self.exhausted

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

    def hold(self, oldest: int, data_iter: Optional[Iterator[Any]]) -> None:
        """``progress(advance=False)``: iteration ``oldest`` retired; nothing more is handed out until ``unhold``."""
        self.move(HELD)
        self.held = Held(oldest, data_iter)

    def unhold(self) -> Optional[Held]:
        """``advance()``: what the last ``hold`` kept (None if the run is not held)."""
        held, self.held = self.held, None
        if held is not None:
            self.move(RUNNING)
        return held

    # -- workers --------------------------------------------------------------------------------

    def start_workers(self, groups: List[str], batches: RunBatches, enter_thread: Callable[[str], Callable[[], None]],
                      caller_group: Optional[str], caller_batches: RunBatches) -> None:
        """One worker per thread group (the caller's group runs on the caller's thread instead, its waits
        bounded by ``progress_timeout``: see ``on_caller_error``)."""
        for group in groups:
            if group == caller_group:
                self.caller = CallerWorker(group, caller_batches, self.on_caller_error)
                self.workers[group] = self.caller
                continue
            worker = Worker(group, batches, self.on_worker_error, enter_thread(group))
            self.workers[group] = worker  # registered before it starts, so that stop() always sees it
            worker.start()

    def watch(self, owner: object) -> None:
        """Abandon this run when ``owner`` (its pipeline) is garbage-collected (see ``Worker.watch``)."""
        for worker in self.workers.values():
            if isinstance(worker, Worker):
                worker.watch(owner, self.abandon_nowait)

    def worker_on(self, thread: threading.Thread) -> Optional[Worker]:
        """This run's worker whose thread is ``thread``, if any. Threads are told apart by object: a new thread
        may reuse the ident of an ended one."""
        for worker in list(self.workers.values()):
            if isinstance(worker, Worker) and worker.thread is thread:
                return worker
        return None

    def caller_unit(self) -> Optional[Work]:
        """The unit of the caller's thread group that the driving thread is running, if any."""
        return self.caller.current if self.caller is not None else None

    # -- fetching and retiring (the caller's thread) ---------------------------------------------

    def fetch(self, data_iter: Optional[Iterator[Any]]) -> Optional[IterContext]:
        """The next iteration's context from the next batch, or None when there is none (yet)."""
        if data_iter is None or self.exhausted:
            return None
        idx = self.num_created
        try:
            batch = self._fetch_on_device(data_iter, idx) if self._batch_roots else next(data_iter)
        except StopIteration:
            self.exhausted = True
            return None
        except BaseException as exc:
            add_note(exc, f"swpipeline: the data iterator raised while fetching the batch for iteration {idx}; "
                          f"in-flight iterations {sorted(self.contexts)} were abandoned")
            raise
        ctx = IterContext(batch, idx)
        self.num_created = idx + 1
        self.contexts[idx] = ctx
        self.peak_live_contexts = max(self.peak_live_contexts, len(self.contexts))
        return ctx

    def _fetch_on_device(self, data_iter: Iterator[Any], idx: int) -> Any:
        """The next batch, and an event after it on the caller's current stream for the tasks that read it.

        Whatever the data iterator does on the device (a copy, a collate on the GPU) goes to
        the stream current on this thread. A task with no producer in its iteration that
        runs on another stream waits for this event before it starts (``executor``); every
        other task follows one of those, or runs on this stream after it.
        """
        device, slot = self.device, idx % self.event_slots
        stream = device.caller_stream()
        batch = device.fetch(stream, data_iter, idx)
        if any(root != stream for root in self._batch_roots):
            if not self.batch_events:
                self.batch_events.extend(device.new_event() for _ in range(self.event_slots))
            device.record(self.batch_events[slot], stream)
            self.batch_streams[slot] = stream
        else:
            self.batch_streams[slot] = None
        return batch

    def retire_oldest(self) -> int:
        """Wait for the oldest iteration in flight to complete and retire it; raise the run's failure if any."""
        oldest = self.next_retire
        board = self.board
        if self.error is not None or not board.is_iteration_done(oldest):
            if not board.wait_iteration(oldest, self.progress_timeout, self.has_failed):
                raise ProgressTimeoutError(oldest, board.unfinished(oldest), self.progress_timeout,
                                           self.blocked_waits(oldest))
            if self.error is not None:
                raise self.error
        if self.device.uses_events:
            default = self.default_stream
            slot = oldest % self.event_slots
            for task in self.tasks:
                if task.waits_at_retire and task.events is not None:
                    self.device.wait(default, task.events[slot])
        self.last_ctx = self.contexts.pop(oldest)
        self.next_retire = oldest + 1
        return oldest

    def settle(self, targets: Dict[int, int]) -> None:
        """Wait until each task has done its iteration in ``targets`` (the units that can still run at a step
        boundary, see ``base``); raise the run's failure if any, or ProgressTimeoutError naming what is left."""
        board = self.board
        pending = sorted(((task, it) for task, it in targets.items() if board.done[task] <= it),
                         key=lambda unit: (unit[1], unit[0]))
        if pending and not board.wait_units(pending, self.progress_timeout, self.has_failed):
            left = [(task, it) for task, it in pending if board.done[task] <= it]
            first = left[0][1]
            raise ProgressTimeoutError(first, [f"{board.names[task]} (iteration {it})" for task, it in left],
                                       self.progress_timeout, self.blocked_waits(first),
                                       waited_for="the units already handed out to finish at the step boundary")
        if self.error is not None:
            raise self.error

    def blocked_waits(self, iter_idx: int) -> List[str]:
        """For each unfinished task of ``iter_idx``, the dependencies it is still missing."""
        done, names = self.board.done, self.board.names
        waits = []
        for task in self.tasks:
            if done[task.index] > iter_idx:
                continue
            missing = [f"{names[d]!r} (iteration {iter_idx})" for d, _ in task.intra if done[d] <= iter_idx]
            missing += [f"{names[d]!r} (iteration {iter_idx - back})" for d, _, back in task.inter
                        if 0 <= iter_idx - back and done[d] <= iter_idx - back]
            if missing:
                waits.append(f"{task.name!r} waits for {', '.join(missing)}")
        return waits

    # -- failure ---------------------------------------------------------------------------------

    def has_failed(self) -> bool:
        return self.error is not None or self.state is FAILED

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
        if isinstance(exc, (DependencyTimeoutError, SequencerTimeoutError)) and \
                self.caller_timeout < self.signal_timeout:
            oldest = self.next_retire
            timeout = ProgressTimeoutError(oldest, self.board.unfinished(oldest), self.progress_timeout,
                                           self.blocked_waits(oldest))
            timeout.__cause__ = exc
            exc = timeout
        self.on_worker_error(exc, unit)

    def record_failure(self, exc: BaseException) -> None:
        """Keep the first failure of a running run, and wake every thread waiting on it.

        Once the run stopped nothing is kept: the exception's traceback holds frames that refer
        back to this run (a worker's, through its report), a cycle only a garbage collection frees.
        """
        with self.lock:
            first = self.error is None and self.active
            again = exc is self.error
            if first:
                self.error = exc
        if not (first or again or isinstance(exc, PipelineAborted)):  # never dropped silently, never kept:
            logger.warning("swpipeline: a later failure after the run's first one (raised to the caller) or after "
                           "it stopped: %s", f"{type(exc).__name__}: {exc}")  # a log record holds only text
        self.abort()

    def abort(self) -> None:
        """Every wait of this run raises PipelineAborted from now on; no worker starts another unit."""
        self.board.abort()
        for turns in self.turns:
            turns.abort()

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
                self.move(state)
                if self.state is not FINISHED:
                    self.abort()
                if not self._joined:
                    self._join_workers(deadline)
                    self._joined = True
                break
            except BaseException as exc:  # e.g. a second Ctrl-C: finish stopping first
                if pending is None:
                    pending = exc
        self.stragglers = [w for w in self.workers.values() if isinstance(w, Worker) and w.alive]
        self._let_go()
        if not self.stragglers:
            shutdown.forget(self)
        if pending is not None:
            try:
                raise pending
            finally:
                pending = None  # this frame is on its traceback: keeping it as a local would be a cycle
        return self.stragglers

    def _join_workers(self, deadline: float) -> None:
        """Ask every worker to end, and join each against the shared ``deadline``."""
        workers = list(self.workers.values())
        for worker in workers:
            worker.stop()
        me = threading.current_thread()
        for worker in workers:
            if isinstance(worker, Worker) and worker.alive and worker.thread is not me:
                worker.join(max(0.0, deadline - time.monotonic()))

    def _let_go(self) -> None:
        """Drop what a stopped run holds of the caller's (see "No reference cycles" above)."""
        with self.lock:
            self.error = None
        self.contexts.clear()
        self.held = self.data_source = None
        handout = getattr(self, "handout", None)
        if handout is not None:
            handout.let_go()
        for worker in list(self.workers.values()):
            if isinstance(worker, Worker):
                worker.discard_queued()

    def stop_at_exit(self, join_timeout: float) -> None:
        """The interpreter is exiting: abandon, joining the workers within ``join_timeout`` at most."""
        self.join_timeout = min(self.join_timeout, join_timeout)
        self.stop(ABANDONED)

    def threads_alive(self) -> bool:
        return any(isinstance(w, Worker) and w.alive for w in list(self.workers.values()))

    def abandon_nowait(self) -> None:
        """Abandon without joining (the pipeline is gone): wake everyone, ask every worker to end."""
        self.move(ABANDONED)
        self.abort()
        for worker in list(self.workers.values()):
            worker.stop()


class Stragglers:
    """Worker threads of ended runs still inside a task: a later fill waits until they are gone."""

    def __init__(self) -> None:
        self.workers: List[Worker] = []

    def adopt(self, run: Run, found: List[Worker]) -> None:
        """Remember the stragglers ``run.stop`` returned, warning once about each."""
        for worker in found:
            if worker in self.workers:
                continue
            self.workers.append(worker)
            unit = worker.current
            doing = unit_text(unit) if unit is not None else "start-up"
            logger.warning("worker thread %r did not stop within %.1f s (still in %s); a later fill_pipeline() "
                           "waits for it", worker.thread.name, run.join_timeout, doing)

    def check(self, join_timeout: float) -> None:
        """Raise RuntimeError naming a straggler still inside a task (the new run would share its lanes)."""
        self.workers = [w for w in self.workers if w.alive]
        for worker in self.workers:
            unit = worker.current
            if unit is not None:
                raise RuntimeError(
                    f"fill_pipeline(): thread {worker.thread.name!r} of an earlier run is still running "
                    f"{unit_text(unit)} on stream {unit[1].stream!r}, which this run "
                    f"needs; wait until that task returns (it did not within join_timeout={join_timeout:g} s), "
                    f"then call fill_pipeline() again"
                )
