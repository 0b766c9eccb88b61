"""Who may drive a pipeline: one thread at a time, never from inside one of its own tasks.

The driving calls (``fill_pipeline``, ``progress``, ``advance``, ``drain``, ``abandon``,
``run``, ``run_serial``, ``run_one_serial_iter``) are marked with ``@driving``. A call
*claims* the pipeline for its thread and releases it when it returns. Refused at once,
with an error naming both parties, before anything of the pipeline is touched:

* a second thread calling while another is inside a driving call;
* a driving call made from inside another one on the same thread (from the data
  iterator, or from a task running on the caller's thread);
* a task (or ``worker_init``) of the pipeline's own run calling it: it would wait for itself.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, List, Optional, Tuple, TypeVar, cast

__all__: List[str] = []

F = TypeVar("F", bound=Callable[..., Any])
Claim = Tuple[Optional[int], str, str]  # (thread ident, method, thread name)
UnitOn = Callable[[int], Optional[Tuple[Any, ...]]]  # thread ident -> the unit a run's worker runs there


class DriverSeat:
    """The claim on one pipeline: who is driving it right now, if anyone."""

    def __init__(self) -> None:
        self.holder: Optional[Claim] = None
        self._lock = threading.Lock()

    def claim(self, claim: Claim, unit_on: Optional[UnitOn]) -> None:
        """Take the seat for ``claim``, or raise RuntimeError saying who holds it (see the module docstring)."""
        me, what, _ = claim
        unit = unit_on(me) if unit_on is not None and me is not None else None
        if unit is not None:
            where = "while its thread starts (worker_init)" if len(unit) < 2 else (
                f"from inside task {unit[0].name!r} (iteration {unit[1].iter_idx})")
            raise RuntimeError(f"{what}() called {where}: a task must not drive the pipeline that runs it "
                               f"(it would wait for itself); drive it from the thread that called fill_pipeline()")
        with self._lock:
            holder = self.holder
            if holder is None:
                self.holder = claim
                return
        if holder[0] == me:
            raise RuntimeError(f"{what}() called while this thread is already inside {holder[1]}() (from the data "
                               f"iterator, or from a task running on the caller's thread); a pipeline cannot be "
                               f"driven from within its own driving call")
        raise RuntimeError(f"{what}() called from thread {claim[2]!r} while thread {holder[2]!r} is in {holder[1]}(); "
                           f"a pipeline is driven by one thread at a time (fill_pipeline, progress, advance, drain, "
                           f"abandon, run): call it from that thread, or after its call returns")

    def release(self, claim: Claim) -> None:
        if self.holder is claim:
            self.holder = None


def driving(method: F) -> F:
    """Mark a pipeline method that drives it; the pipeline has ``_seat`` and ``_unit_on``."""
    name = method.__name__

    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        me = threading.current_thread()
        claim: Claim = (me.ident, name, me.name)
        seat: DriverSeat = self._seat
        try:
            seat.claim(claim, self._unit_on())
            return method(self, *args, **kwargs)
        finally:
            seat.release(claim)

    return cast(F, guarded)
