"""One worker thread per thread group and run, fed through a FIFO queue.

A queue item is a *batch* of work units that the worker runs in order: the
clock-driven engine puts one batch per thread group per period (one hand-off
between threads per period, not per task); the data-flow engine puts what became
ready. A unit is a ``schedule.Work`` (its period, slot and context). An item also carries the torch modes of
the call that handed it out (``modes.Modes``, None for a fresh thread's), which its
units run under.

Guarantees:

* a worker never dies silently: an exception from a unit (or from its thread's
  set-up) is handed to ``report``, which cannot fail, and the worker then stops;
* after its run is aborted a worker starts no further unit: it checks before each;
* units run through the run's plain executor, or through its annotated one (a profiler
  range per unit) while a torch profiler records: asked once per queue item;
* ``current`` is the unit it is running (None between queue items; set by the run's batch
  runner, ``executor.make_batch_runner``), so that a straggler
  can be named and a task that drives its own pipeline can be recognised;
* once its thread has ended, it lets go of its run on request (``let_go``): what is left in
  its queue (units it will never run hold their contexts, the caller's batches) and the
  run's callback of ``watch`` (a bound method of the run, which holds the worker: a cycle);
* when the pipeline it works for is garbage-collected, the worker ends its run and
  itself (``watch``). No Python code runs in the collector for it: the weak
  reference's callback is the queue's own (C) ``put``, which hands the worker the dead
  reference. A Ctrl-C can be lost in Python code run during a collection ("Exception
  ignored in ..."); this way there is none of ours.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import queue
import signal
import sys
import threading
import time
import weakref
from typing import Any, Callable, Deque, List, Optional, Sequence, Tuple, Union

import torch

from ..devices.annotations import profiler_active
from .modes import Modes, weight_cache_off
from .executor import RunBatch
from .schedule import WHOLE_PERIOD, Work

__all__: List[str] = []

Report = Callable[[BaseException, Optional[Work]], None]
RunBatches = Tuple[RunBatch, RunBatch]  # (plain, annotated): see _UnitRunner


_STOP = object()
_PR_SET_NAME = 15  # linux/prctl.h


def name_os_thread(name: str) -> None:
    """Give the calling OS thread ``name`` (Linux; at most 15 bytes), so that profilers show it; best effort.

    Python names only its own ``threading.Thread`` object; the torch profiler's trace,
    ``top -H`` and py-spy read the OS thread name, which is otherwise ``python``.
    """
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


@functools.lru_cache(maxsize=None)
def _prctl() -> Any:
    """libc's ``prctl``, loaded once (a ``ctypes.CDLL`` is a reference cycle: one per thread would be garbage for
    the collector); None off Linux or where it cannot be found."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return None


class held_interrupts:
    """On the main thread, hold Ctrl-C (SIGINT) for the block: it is raised just before or right after it.

    A Ctrl-C that already arrived is raised on entry, before the block starts; one that
    arrives during the block waits (blocked by the OS) and is raised at the first Python
    call after it. Elsewhere (other threads, systems without ``pthread_sigmask``) it does nothing.
    """

    def __enter__(self) -> None:
        self._unblock = False
        if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
            return
        if signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []):  # (a query) held already
            return
        try:
            self._unblock = True
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            _checkpoint()  # a Python-level call: a Ctrl-C already pending is raised here
        except BaseException:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            raise

    def __exit__(self, *exc: Any) -> None:
        if self._unblock:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _checkpoint() -> None:
    """Nothing; calling it lets the interpreter run pending signal handlers."""


def _nothing() -> None:
    """Nothing."""


def enter_worker_thread(torch_threads: int, device: Any, worker_init: Optional[Callable[[str], None]],
                        group: str) -> None:
    """What a pipeline's worker thread does first: the caller's torch thread count (a per-thread setting
    of torch), the device's per-thread set-up, then the user's ``worker_init(group)``."""
    torch.set_num_threads(torch_threads)
    device.enter_thread()
    if worker_init is not None:
        worker_init(group)


class _UnitRunner:
    """What both kinds of worker share: running a queue item's units, one at a time, in order, through the run's
    batch runner (``executor.make_batch_runner``), which names the unit being run in ``current`` and hands a
    failure to ``report``."""

    current: Optional[Work]  # the unit being run (None between batches)
    report: Report
    _run_batch: RunBatch
    _annotated_batch: RunBatch

    def _run_units(self, units: Sequence[Work], modes: Optional[Modes]) -> bool:
        """Run ``units`` in order under ``modes`` (None: the thread's own); False if the worker must end (its
        run was aborted, or a unit failed)."""
        run_batch = self._annotated_batch if profiler_active() else self._run_batch
        if modes is None:
            return run_batch(units, self)
        with modes.applied():
            return run_batch(units, self)


class Worker(_UnitRunner):
    """A thread that runs the units put to it, in order, until stopped, aborted or failed."""

    def __init__(self, group: str, batches: RunBatches, report: Report, enter_thread: Callable[[], None]) -> None:
        self.group = group
        self.current: Optional[Work] = None
        self._queue: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._run_batch, self._annotated_batch = batches
        self.report = report
        self._enter_thread = enter_thread
        self._launched = False
        self._orphaned: Callable[[], None] = _nothing
        self._owner: Optional["weakref.ReferenceType[Any]"] = None
        self._finished = threading.Event()  # set by the thread itself, as the last thing it does
        self.thread = threading.Thread(target=self._loop, name=f"swp-{group}", daemon=True)
        # CPython keeps every Thread in a WeakSet whose callback runs when the Thread is freed, often on the
        # caller's thread; a Ctrl-C landing in that callback is printed and ignored. Our threads need no such
        # bookkeeping (the pipeline joins them), so they are taken out of it.
        dangling = getattr(threading, "_dangling", None)
        if dangling is not None:
            dangling.discard(self.thread)

    def start(self) -> None:
        self._launched = True
        # Thread.start() waits for the new thread to come up; an interrupt in that wait would leave a
        # thread running that start() reported as failed. Hold Ctrl-C until it returns.
        with held_interrupts():
            self.thread.start()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the thread to end.

        It waits for the worker's own end-of-thread signal, not ``Thread.join`` alone: a Ctrl-C
        landing inside ``Thread.join`` can make it mark a thread stopped that still runs
        (CPython bpo-45274), after which ``Thread.join`` returns at once.
        """
        if not self._launched:
            return
        deadline = time.monotonic() + timeout
        if not self._finished.wait(timeout):
            return  # still running: a straggler
        while any(t is self.thread for t in threading.enumerate()):  # its last few instructions
            if time.monotonic() >= deadline:
                return
            time.sleep(0.0002)

    def put(self, units: Sequence[Work], modes: Optional[Modes] = None, period: Optional[int] = None) -> None:
        self._queue.put((modes, units))

    def watch(self, owner: object, orphaned: Callable[[], None]) -> None:
        """When ``owner`` is garbage-collected, call ``orphaned()`` on this thread and end (module docstring)."""
        self._orphaned = orphaned
        self._owner = weakref.ref(owner, self._queue.put)

    def stop(self) -> None:
        """Ask the thread to end once it is between units (it ends at once if it is waiting for work)."""
        self._queue.put(_STOP)

    def let_go(self) -> None:
        """If the thread has ended, drop what it holds of its run: the units left in its queue (they hold
        contexts) and ``watch``'s owner and callback (a bound method of the run, which holds this worker: a
        reference cycle, run -> crew -> worker -> run, that only a garbage collection would free)."""
        if self.alive:
            return
        self._orphaned = _nothing
        self._owner = None
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return

    @property
    def alive(self) -> bool:
        return self._launched and not self._finished.is_set()

    def _loop(self) -> None:
        try:
            self._serve()
        finally:
            self._finished.set()

    def _serve(self) -> None:
        name_os_thread(self.thread.name)
        weight_cache_off()  # for the thread's life: its tasks' own autocast regions cache no casts (modes.py)
        try:
            self._enter_thread()
        except BaseException as exc:
            self.report(exc, None)
            return
        get, run_units = self._queue.get, self._run_units
        while True:
            item = get()
            if item is _STOP:
                return
            if type(item) is weakref.ReferenceType:  # the pipeline was collected (see watch)
                self._orphaned()
                return
            modes, units = item
            if not run_units(units, modes):
                return



class CallerWorker(_UnitRunner):
    """A thread group whose units run on the thread that calls ``progress()``, not on a worker thread.

    Units queue up as for a ``Worker``; ``run_queued()`` runs them in order, stopping at
    the first failure (reported through ``report``) exactly as a worker thread does.
    """

    def __init__(self, group: str, batches: RunBatches, report: Report) -> None:
        self.group = group
        self.current: Optional[Work] = None
        self.thread: Optional[threading.Thread] = None
        self._queue: Deque[Tuple[Optional[Modes], Sequence[Work], Optional[int]]] = collections.deque()
        self._run_batch, self._annotated_batch = batches
        self.report = report
        self.ran_to: Tuple[int, int] = (-1, WHOLE_PERIOD)  # (through, cut) of the last run_queued: all up to it ran

    def put(self, units: Sequence[Work], modes: Optional[Modes] = None, period: Optional[int] = None) -> None:
        """Queue ``units``; ``period``: the (virtual) period they all belong to, if the engine runs the group
        only up to some point per call (see ``run_queued``)."""
        self._queue.append((modes, units, period))

    def run_queued(self, through: int, cut: int = WHOLE_PERIOD) -> None:
        """Run what was queued, in order, each item under the modes of the call that handed it out.

        Only the units of periods up to ``through`` run and, of that period, those whose
        slot's submission position is at most ``cut`` (``WHOLE_PERIOD``: all of them); the
        rest stays queued for a later call. The hand-out puts a period as two items where
        ``Schedule.retire_cut`` splits it, the only cut besides ``WHOLE_PERIOD``: an item
        then runs whole or not at all.
        """
        self.ran_to = (through, cut)
        pending, run_units = self._queue, self._run_units
        while pending:
            modes, units, period = pending[0]
            if period is not None and period >= through and (period > through or units[0][1].position > cut):
                return  # (period, slot, context)
            pending.popleft()
            if not run_units(units, modes):
                pending.clear()
                return

    def stop(self) -> None:
        self._queue.clear()

    @property
    def alive(self) -> bool:
        return False


WorkerLike = Union[Worker, CallerWorker]
