"""Who may drive a pipeline: one thread at a time, never from inside one of its own tasks.

The driving calls (``fill_pipeline``, ``progress``, ``advance``, ``drain``, ``abandon``,
``run``, ``run_serial``, ``run_one_serial_iter``) are marked with ``@driving``. A call
*claims* the pipeline for its thread and releases it when it returns. Refused at once,
with an error naming both parties, before anything of the pipeline is touched:

* a second thread calling while another is inside a driving call;
* a driving call made from inside another one on the same thread (from the data
  iterator, or from a task running on the caller's thread);
* a task (or ``worker_init``) of the pipeline's own run calling it: it would wait for itself.

Threads are told apart by their ``threading.Thread`` object, never by ident: a new thread
often gets the ident of one that ended, such as a worker of the run before. While a
thread group runs on the driving thread (``caller_thread_group``), its task is that
thread's, so a call from another thread names both threads and the task.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Protocol, Tuple, TypeVar, cast

from .modes import restore_weight_cache, weight_cache_off

if TYPE_CHECKING:
    from .schedule import Work

__all__: List[str] = []

F = TypeVar("F", bound=Callable[..., Any])
Claim = Tuple[threading.Thread, str]  # a driving call in progress: its thread (the object) and the method


class Busy(Protocol):
    """A worker thread of the run: the unit it runs (``current``); None in its start-up (``worker_init``)."""

    current: Optional["Work"]


class Occupancy(Protocol):
    """What the pipeline's current run is doing on which thread (``run.Run``)."""

    def worker_on(self, thread: threading.Thread) -> Optional[Busy]: ...

    def caller_unit(self) -> Optional["Work"]: ...


def unit_text(unit: "Work") -> str:
    """A unit in words: ``task 'Forward' (iteration 3)``."""
    _, slot, ctx = unit
    return f"task {slot.task!r} (iteration {ctx.iter_idx})"


class DriverSeat:
    """The claim on one pipeline: who is driving it right now, if anyone."""

    def __init__(self) -> None:
        self.holder: Optional[Claim] = None
        self._lock = threading.Lock()

    def claim(self, claim: Claim, run: Optional[Occupancy]) -> None:
        """Take the seat for ``claim``, or raise RuntimeError saying who holds it (see the module docstring)."""
        me, what = claim
        worker = run.worker_on(me) if run is not None else None
        if worker is not None:  # a task of the run, or worker_init (its thread runs nothing else)
            unit = worker.current
            where = f"from inside {unit_text(unit)}" if unit is not None else "while its thread starts (worker_init)"
            raise RuntimeError(f"{what}() called {where}: a task must not drive the pipeline that runs it "
                               f"(it would wait for itself); drive it from the thread that called fill_pipeline()")
        with self._lock:
            holder = self.holder
            if holder is None:
                self.holder = claim
                return
        holder_thread, holder_method = holder
        busy = run.caller_unit() if run is not None else None
        if holder_thread is me:
            if busy is not None:
                raise RuntimeError(f"{what}() called from inside {unit_text(busy)}, which {holder_method}() runs "
                                   f"on this thread: a task must not drive the pipeline that runs it (it would "
                                   f"wait for itself)")
            raise RuntimeError(f"{what}() called while this thread is already inside {holder_method}() (from the "
                               f"data iterator, or from a task running on the caller's thread); a pipeline cannot "
                               f"be driven from within its own driving call")
        doing = f", inside {unit_text(busy)}" if busy is not None else ""
        raise RuntimeError(f"{what}() called from thread {me.name!r} while thread {holder_thread.name!r} is in "
                           f"{holder_method}(){doing}; a pipeline is driven by one thread at a time "
                           f"(fill_pipeline, progress, advance, drain, abandon, run): call it from that thread, or "
                           f"after its call returns")

    def release(self, claim: Claim) -> None:
        if self.holder is claim:
            self.holder = None


def driving(method: F) -> F:
    """Mark a pipeline method that drives it; the pipeline has ``_seat`` and ``_occupancy``."""
    name = method.__name__

    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        claim: Claim = (threading.current_thread(), name)
        seat: DriverSeat = self._seat
        cached = weight_cache_off()  # the caller's tasks run in here (modes.py); its own setting comes back
        try:
            seat.claim(claim, self._occupancy())
            return method(self, *args, **kwargs)
        finally:
            seat.release(claim)
            restore_weight_cache(cached)

    return cast(F, guarded)
