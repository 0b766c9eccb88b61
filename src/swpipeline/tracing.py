"""Traced runs: ``run(trace=...)``, ``with pipe.tracing():``, ``pipe.timeline`` and ``pipe.stats()``.

A fill is traced when asked (``run(trace=True)`` or a path, ``run(verbose=True)``, or a
``fill_pipeline()`` inside ``with pipe.tracing():``); it then gets a ``Recorder`` and the
engine wraps its unit executor with it (``executor.traced``). The recorder of the last
traced fill stays readable until the next fill.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, ContextManager, List, Optional, Sequence

from .records import PathLike
from .scoped import Scoped
from .stats import RunStats
from .timeline import Recorder, Timeline

if TYPE_CHECKING:
    from .device import Device
    from .runtime import TaskRuntime

__all__: List[str] = []


class Tracing:
    """The tracing half of a pipeline's public API (mixed into ``_PipelineBase``)."""

    device: "Device"

    def __init__(self) -> None:
        self._tracing = False  # record a timeline at the next fill
        self._recorder: Optional[Recorder] = None  # the last fill's, if it was traced

    def _serial_names(self) -> Sequence[str]:
        raise NotImplementedError

    def _new_recorder(self, tasks: Sequence["TaskRuntime"], inline_group: Optional[str]) -> Optional[Recorder]:
        """A recorder for the fill that starts now, if it is traced (else None, and the last one is dropped).

        ``inline_group``: a thread group that runs on the calling thread in this fill, if any.
        """
        self._recorder = None
        if not self._tracing:
            return None
        device = self.device
        new_event = None
        if device.has_timing_events:
            device.synchronize()  # the recorder's reference event then marks "now" on the device
            new_event = device.new_timing_event
        caller = (inline_group, threading.current_thread().name) if inline_group is not None else None
        self._recorder = Recorder(tasks, self._serial_names(), type(self).__name__, str(device), new_event,
                                  device.default_stream(), caller)
        return self._recorder

    def _begin_traced_run(self, record: bool) -> bool:
        """Trace the next fill if ``record``; returns the setting to restore with ``_end_traced_run``."""
        was_tracing, self._tracing = self._tracing, self._tracing or record
        return was_tracing

    def _end_traced_run(self, was_tracing: bool) -> None:
        self._tracing = was_tracing
        if self._recorder is not None:
            self._recorder.close()

    def _publish_trace(self, trace_path: Optional[PathLike], verbose: bool) -> None:
        """After a traced run: write the Chrome trace to ``trace_path`` and print the statistics if asked."""
        if self._recorder is not None and trace_path is not None:
            self._recorder.timeline().save_chrome_trace(trace_path)
        if verbose:
            print(self.stats().format(), file=sys.stderr)

    def tracing(self) -> ContextManager[None]:
        """Record the timeline of every ``fill_pipeline()`` started in the block; read ``pipe.timeline`` after.

        For step-by-step loops; ``run(data, trace=True)`` is the one-call form.
        """
        return Scoped(lambda: self._begin_traced_run(True), self._end_traced_run)

    @property
    def timeline(self) -> Optional[Timeline]:
        """What the last fill ran where and when, if it was traced (see ``run(trace=...)``), else None."""
        return self._recorder.timeline() if self._recorder is not None else None

    def stats(self) -> RunStats:
        """Per-task and per-run statistics of the last traced run (``print(pipe.stats())`` shows a table).

        Raises:
            RuntimeError: the last run was not traced.
        """
        timeline = self.timeline
        if timeline is None:
            raise RuntimeError("stats(): the last run was not traced; use run(data, trace=True) (or verbose=True, "
                               "or fill_pipeline() inside `with pipe.tracing():`) to record what stats() summarizes")
        return timeline.stats()
