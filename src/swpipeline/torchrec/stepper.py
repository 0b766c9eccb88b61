"""StepwisePipeline: the clock-driven engine with TorchRec's step boundary.

``SWPipeline.progress()`` retires the oldest iteration and then enqueues the next
period at once, so the next period's work runs while the caller handles the
result. A TorchRec ``progress()`` call is one whole period: when it returns,
the model and optimizer are left alone until the next call (users step an LR
scheduler or read metrics there). ``progress_deferred()`` retires without
enqueuing; ``advance()`` enqueues the deferred period (fetching its batch)::

    TorchRec call k  ==  advance()            enqueue period k + depth - 1
                         progress_deferred()  wait for iteration k, retire it

``abandon()`` stops without running what is in flight (TorchRec's
``execute_all_batches=False``).

``caller_group`` runs one thread group's units on the thread that calls
``progress()``, as TorchRec runs its whole step on the training thread: with
every model task on that group, a step costs no thread hand-off at all (on a
busy 2-core machine each hand-off can wait a scheduler slice).

These use engine hooks (``_do_retire``, ``_start_workers``, ``_workers``,
``_stop_workers``, ``_reset_state``); docs/torchrec.md proposes the public API.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

from ..clocked import SWPipeline
from ..device import DeviceSpec
from ..plan import IterContext, PipelinePlan

__all__: List[str] = []


class CallerThreadWorker:
    """Stands in for a thread group's worker: its units run on the thread that calls progress()."""

    def __init__(self, group: str, run_unit: Callable[..., None], on_error: Callable[[BaseException, Any], None],
                 is_aborted: Callable[[], bool]) -> None:
        self.group = group
        self._run_unit = run_unit
        self._on_error = on_error
        self._is_aborted = is_aborted
        self._queue: Deque[Any] = collections.deque()
        self.alive = False

    def put(self, units: Any) -> None:
        self._queue.append(units)

    def run_queued(self) -> None:
        """Run every unit queued so far, in order (stops at the first failure, as a worker thread does)."""
        queue = self._queue
        while queue:
            units = queue.popleft()
            for unit in units:
                if self._is_aborted():
                    queue.clear()
                    return
                try:
                    self._run_unit(*unit)
                except BaseException as exc:
                    self._on_error(exc, unit)
                    queue.clear()
                    return

    def stop(self) -> None:
        self._queue.clear()

    def join(self, timeout: float) -> bool:
        return True


class StepwisePipeline(SWPipeline):
    """An SWPipeline whose next period can be enqueued separately from the retirement.

    Args:
        plan, device, signal_timeout, progress_timeout: as for SWPipeline.
        caller_group: a thread group whose units run on the thread that calls
            ``progress()`` (in order, before it waits) instead of on a worker thread.
    """

    def __init__(self, plan: PipelinePlan, device: DeviceSpec = None, *, signal_timeout: float = 30.0,
                 progress_timeout: float = 60.0, caller_group: Optional[str] = None) -> None:
        self.caller_group = caller_group
        self._caller_worker: Optional[CallerThreadWorker] = None
        super().__init__(plan, device, signal_timeout=signal_timeout, progress_timeout=progress_timeout)

    def _start_workers(self) -> None:
        super()._start_workers()
        workers: Dict[str, Any] = self._workers
        self._caller_worker = None
        if self.caller_group in workers:
            thread_worker = workers[self.caller_group]  # replaced by the caller's thread: stop it
            thread_worker.stop()
            thread_worker.join(5.0)
            self._caller_worker = CallerThreadWorker(self.caller_group, thread_worker._run_unit,
                                                     self._on_worker_error, self._is_aborted)
            workers[self.caller_group] = self._caller_worker

    def progress(self, data_iter: Optional[Iterator[Any]] = None) -> int:
        """As SWPipeline.progress; first runs the caller group's queued units on this thread."""
        if self._caller_worker is not None:
            self._caller_worker.run_queued()
        return super().progress(data_iter)

    def _reset_state(self) -> None:
        super()._reset_state()
        self._defer = False
        self._deferred: Optional[Tuple[int, Optional[Iterator[Any]]]] = None

    def progress_deferred(self, data_iter: Optional[Iterator[Any]]) -> int:
        """``progress()`` that leaves the next period for ``advance()``; returns the retired iteration."""
        self._defer = True
        try:
            return self.progress(data_iter)
        finally:
            self._defer = False

    def advance(self, fetch: bool = True) -> None:
        """Enqueue the period the last ``progress_deferred()`` left, drawing its batch unless ``fetch`` is False."""
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            oldest, data_iter = deferred
            super()._do_retire(oldest, data_iter if fetch else None)

    def contexts_in_flight(self) -> List[IterContext]:
        """The IterContexts of the iterations in flight, oldest first."""
        return [self._contexts[i] for i in sorted(self._contexts)]

    def _do_retire(self, oldest: int, data_iter: Optional[Iterator[Any]]) -> None:
        if self._defer:
            self._deferred = (oldest, data_iter)
        else:
            super()._do_retire(oldest, data_iter)

    def drain(self) -> None:
        """Retire everything in flight (enqueuing a deferred period first, without a new batch)."""
        if self._deferred is not None:
            self.advance(fetch=False)
        super().drain()

    def abandon(self) -> None:
        """Stop and join the workers without running the iterations still in flight; ready for a new fill."""
        self._stop_workers()
        self.device.synchronize()
        self._reset_state()
