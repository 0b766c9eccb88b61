"""The serial baseline: the same plan, one iteration after another on the caller's thread.

``run_serial`` runs every batch through the tasks in ``serial_order`` (a topological
order of the intra-iteration dependencies; ties by stage, then name), with no worker
threads and no stream switching: the reference every pipelined run must equal.
``run_one_serial_iter`` runs one iteration and returns its context (the profiler and
the shortcut's caching run use it). Both are refused while pipelined iterations are
in flight, and both drive the pipeline (``driving.py``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterable, List, Optional

from .annotations import profiler_active, resolve_emit_nvtx, run_annotated
from .driving import driving
from .errors import annotate, stop_iteration_error
from .plan import IterContext
from .progress_line import ProgressLine, len_or_none

if TYPE_CHECKING:
    from .device import Device
    from .run import Run
    from .runtime import TaskRuntime
    from .shortcut import ShortcutTable

__all__: List[str] = []


class SerialBaseline:
    """The serial half of a pipeline's public API (mixed into ``_PipelineBase``)."""

    device: "Device"
    _serial_order: List["TaskRuntime"]
    _shortcuts: "ShortcutTable"
    _nvtx: bool

    def _active_run(self) -> Optional["Run"]:
        raise NotImplementedError

    @property
    def serial_order(self) -> List[str]:
        """The tasks in the order a serial iteration runs them (topological; ties by stage, then name)."""
        return [t.name for t in self._serial_order]

    def _serial_names(self) -> List[str]:
        return self.serial_order

    @driving
    def run_one_serial_iter(self, batch: Any, iter_idx: int = 0) -> IterContext:
        """Run one iteration serially on the calling thread, tasks in topological order.

        Needs no fill_pipeline() and leaves no state behind. Returns the IterContext.
        """
        if self._active_run() is not None:
            raise RuntimeError("run_one_serial_iter() while pipelined iterations are in flight; call drain() first")
        return self._serial_iter(batch, iter_idx)

    def _serial_iter(self, batch: Any, iter_idx: int) -> IterContext:
        ctx = IterContext(batch, iter_idx)
        annotate_ranges = self._nvtx or profiler_active()
        for task in self._serial_order:
            try:
                if annotate_ranges:
                    run_annotated(f"SWP_serial/{self._shortcuts.label(task.name)}/iter{iter_idx}", task.exec_fn,
                                  ctx, self._nvtx)
                else:
                    task.exec_fn(ctx)
            except StopIteration as exc:
                raise annotate(stop_iteration_error(exc, task.name, iter_idx), task.name, iter_idx) from exc
            except BaseException as exc:
                raise annotate(exc, task.name, iter_idx)
        return ctx

    @driving
    def run_serial(self, data_iter: Iterable[Any], verbose: bool = False, emit_nvtx: bool = False) -> float:
        """Run every batch serially (no threads, default stream) as a baseline; returns seconds."""
        if self._active_run() is not None:
            raise RuntimeError("run_serial() while pipelined iterations are in flight; call drain() first")
        self._nvtx = resolve_emit_nvtx(emit_nvtx)
        bar = ProgressLine(f"{type(self).__name__} (serial)", len_or_none(data_iter)) if verbose else None
        start = time.perf_counter()
        try:
            for idx, batch in enumerate(data_iter):
                self._serial_iter(batch, idx)
                if bar is not None:
                    bar.step()
            self.device.synchronize()
        finally:
            self._nvtx = False
            if bar is not None:
                bar.close()
        return time.perf_counter() - start
