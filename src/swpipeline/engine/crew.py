"""A run's workers: one per thread group, made together, started together, stopped within one join budget.

A thread group runs on a ``Worker`` thread of its own, or, for the caller's group
(``caller_thread_group``), on the thread that drives the pipeline (``CallerWorker``). The
crew is made whole before any thread starts (``start``), so stopping always sees every
worker; a worker reports a failure through the ``report`` it was given and knows nothing
of the run. Workers of ended runs still inside a task are ``Stragglers``: a later fill
waits until they are gone.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

from .driving import unit_text
from .schedule import Work
from .worker import CallerWorker, Report, RunBatches, Worker, WorkerLike

__all__: List[str] = []

logger = logging.getLogger("swpipeline")

EnterThread = Callable[[str], Callable[[], None]]  # a group -> what its worker thread does first


class Crew:
    """One run's workers (see the module docstring).

    Args:
        groups: the thread groups, in the order work is handed out.
        batches: the batch runners a worker thread runs its queue items with (plain, annotated).
        enter_thread: per group, what its thread does first (torch threads, the device, ``worker_init``).
        report: where a worker thread reports a failure.
        caller_group: the group run on the caller's thread, if any, with its own runners and report.
    """

    def __init__(self, groups: Sequence[str], batches: RunBatches, enter_thread: EnterThread, report: Report,
                 caller_group: Optional[str] = None, caller_batches: Optional[RunBatches] = None,
                 caller_report: Optional[Report] = None) -> None:
        self.workers: Dict[str, WorkerLike] = {}
        self.caller: Optional[CallerWorker] = None
        for group in groups:
            if group == caller_group and caller_batches is not None and caller_report is not None:
                self.caller = CallerWorker(group, caller_batches, caller_report)
                self.workers[group] = self.caller
            else:
                self.workers[group] = Worker(group, batches, report, enter_thread(group))

    @property
    def threads(self) -> int:
        """How many worker threads the crew starts (the caller's group has none)."""
        return sum(isinstance(w, Worker) for w in self.workers.values())

    def start(self) -> None:
        """Start every worker thread (all are registered already, so a stop always sees each)."""
        for worker in self.workers.values():
            if isinstance(worker, Worker):
                worker.start()

    def watch(self, owner: object, orphaned: Callable[[], None]) -> None:
        """Call ``orphaned()`` when ``owner`` (the pipeline) is garbage-collected (see ``Worker.watch``)."""
        for worker in self.workers.values():
            if isinstance(worker, Worker):
                worker.watch(owner, orphaned)

    def worker_on(self, thread: threading.Thread) -> Optional[Worker]:
        """The worker whose thread is ``thread``, if any. Threads are told apart by object: a new thread may reuse
        the ident of an ended one."""
        for worker in list(self.workers.values()):
            if isinstance(worker, Worker) and worker.thread is thread:
                return worker
        return None

    def caller_unit(self) -> Optional[Work]:
        """The unit of the caller's thread group that the driving thread is running, if any."""
        return self.caller.current if self.caller is not None else None

    def ask_to_end(self) -> None:
        """Ask every worker to end once it is between units."""
        for worker in list(self.workers.values()):
            worker.stop()

    def join(self, deadline: float) -> None:
        """Ask every worker to end, and join each against the shared ``deadline`` (``time.monotonic``)."""
        workers = list(self.workers.values())
        for worker in workers:
            worker.stop()
        me = threading.current_thread()
        for worker in workers:
            if isinstance(worker, Worker) and worker.alive and worker.thread is not me:
                worker.join(max(0.0, deadline - time.monotonic()))

    def stragglers(self) -> List[Worker]:
        """The worker threads still alive (after a join: still inside a task)."""
        return [w for w in self.workers.values() if isinstance(w, Worker) and w.alive]

    def threads_alive(self) -> bool:
        return any(isinstance(w, Worker) and w.alive for w in list(self.workers.values()))

    def let_go(self) -> None:
        """Ended workers drop what they hold of their run (``Worker.let_go``): the units they never ran (they hold
        contexts, the caller's batches) and the run itself."""
        for worker in list(self.workers.values()):
            if isinstance(worker, Worker):
                worker.let_go()


class Stragglers:
    """Worker threads of ended runs still inside a task: a later fill waits until they are gone."""

    def __init__(self) -> None:
        self.workers: List[Worker] = []

    def adopt(self, found: List[Worker], join_timeout: float) -> None:
        """Remember the stragglers a run's stop left, warning once about each."""
        for worker in found:
            if worker in self.workers:
                continue
            self.workers.append(worker)
            unit = worker.current
            doing = unit_text(unit) if unit is not None else "start-up"
            logger.warning("worker thread %r did not stop within %.1f s (still in %s); a later fill_pipeline() "
                           "waits for it", worker.thread.name, join_timeout, doing)

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
