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

from ..observe.records import PathLike
from ..scoped import Scoped
from ..observe.stats import RunStats
from ..observe.timeline import Recorder, Timeline

if TYPE_CHECKING:
    from ..devices.device import Device
    from .runtime import BoundTask

__all__: List[str] = []


class Tracing:
    """A pipeline's tracing, one of its parts: whether the next fill is traced, and the last traced fill's recorder."""

    def __init__(self, device: "Device", engine: str, serial_names: Sequence[str]) -> None:
        self.device = device
        self.engine = engine
        self.serial_names = serial_names
        self.on = False  # record a timeline at the next fill
        self.recorder: Optional[Recorder] = None  # the last fill's, if it was traced

    def new_recorder(self, tasks: Sequence["BoundTask"], caller_group: Optional[str]) -> Optional[Recorder]:
        """A recorder for the fill that starts now, if it is traced (else None, and the last one is dropped).

        ``caller_group``: a thread group that runs on the calling thread in this fill, if any.
        """
        self.recorder = None
        if not self.on:
            return None
        device = self.device
        new_event = None
        if device.has_timing_events:
            device.synchronize()  # the recorder's reference event then marks "now" on the device
            new_event = device.new_timing_event
        caller = (caller_group, threading.current_thread().name) if caller_group is not None else None
        self.recorder = Recorder(tasks, self.serial_names, self.engine, str(device), new_event,
                                 device.default_stream(), caller)
        return self.recorder

    def begin(self, record: bool) -> bool:
        """Trace the next fill if ``record``; returns the setting to restore with ``end``."""
        was_tracing, self.on = self.on, self.on or record
        return was_tracing

    def end(self, was_tracing: bool) -> None:
        self.on = was_tracing
        if self.recorder is not None:
            self.recorder.close()

    def publish(self, trace_path: Optional[PathLike], verbose: bool) -> None:
        """After a traced run: write the Chrome trace to ``trace_path`` and print the statistics if asked."""
        if self.recorder is not None and trace_path is not None:
            self.recorder.timeline().save_chrome_trace(trace_path)
        if verbose:
            print(self.stats().format(), file=sys.stderr)

    def scope(self) -> ContextManager[None]:
        """A block in which every fill is traced."""
        return Scoped(lambda: self.begin(True), self.end)

    @property
    def timeline(self) -> Optional[Timeline]:
        return self.recorder.timeline() if self.recorder is not None else None

    def stats(self) -> RunStats:
        timeline = self.timeline
        if timeline is None:
            raise RuntimeError("stats(): the last run was not traced; use run(data, trace=True) (or verbose=True, "
                               "or fill_pipeline() inside `with pipe.tracing():`) to record what stats() summarizes")
        return timeline.stats()
