"""The serial baseline: the same plan, one iteration after another on the caller's thread.

``run_serial`` runs every batch through the tasks in ``serial_order`` (a topological
order of the intra-iteration dependencies; ties by stage, then name), with no worker
threads and no stream switching: the reference every pipelined run must equal.
``run_one_serial_iter`` runs one iteration and returns its context (the profiler and
the shortcut's caching run use it). The pipeline refuses both while pipelined
iterations are in flight, and both drive the pipeline (``driving.py``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, List

from ..devices.annotations import profiler_active, run_annotated
from ..errors import annotate, stop_iteration_error
from ..plan.context import IterContext
from ..observe.progress_line import ProgressLine, len_or_none

if TYPE_CHECKING:
    from ..devices.device import Device
    from .runtime import TaskSpec

__all__: List[str] = []


class SerialBaseline:
    """A pipeline's serial baseline, one of its parts: its tasks in serial order, run on the calling thread.

    The pipeline's ``run_serial`` / ``run_one_serial_iter`` check that nothing is in flight
    and that the caller may drive it, then call these (as driving calls, with autocast's weight
    cache off, as for every task of a pipelined run: ``modes.py``).
    """

    def __init__(self, order: List["TaskSpec"], device: "Device", label: Callable[[str], str], engine: str) -> None:
        self.order = order
        self.device = device
        self.label = label  # a task's name as profiler ranges show it (shortcut tasks: ``Name [skip]``)
        self.engine = engine

    @property
    def names(self) -> List[str]:
        return [t.name for t in self.order]

    def iteration(self, batch: Any, iter_idx: int, nvtx: bool = False) -> IterContext:
        """One iteration: every task in serial order on a new context; returns the context."""
        ctx = IterContext(batch, iter_idx)
        annotate_ranges = nvtx or profiler_active()
        for task in self.order:
            try:
                if annotate_ranges:
                    run_annotated(f"SWP_serial/{self.label(task.name)}/iter{iter_idx}", task.exec_fn, ctx, nvtx)
                else:
                    task.exec_fn(ctx)
            except StopIteration as exc:
                raise annotate(stop_iteration_error(exc, task.name, iter_idx), task.name, iter_idx) from exc
            except BaseException as exc:
                raise annotate(exc, task.name, iter_idx)
        return ctx

    def run(self, data_iter: Iterable[Any], verbose: bool, nvtx: bool) -> float:
        """Every batch, one iteration after another; the device synchronized at the end; returns seconds."""
        bar = ProgressLine(f"{self.engine} (serial)", len_or_none(data_iter)) if verbose else None
        start = time.perf_counter()
        try:
            for idx, batch in enumerate(data_iter):
                self.iteration(batch, idx, nvtx)
                if bar is not None:
                    bar.step()
            self.device.synchronize()
        finally:
            if bar is not None:
                bar.close()
        return time.perf_counter() - start
