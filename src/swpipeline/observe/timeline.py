"""Timelines: what ran where and when, recorded only when asked for.

A ``Recorder`` is made only for a traced fill (``run(trace=...)``,
``run(verbose=True)`` or ``with pipe.tracing():``); the unit executor is then wrapped
(``executor.traced``), so an untraced run executes exactly the code it would without
this module. For every unit the recorded path notes::

    ready -- wait A(i) -- wait B(i-1) -- (phase 2, sequencer, stream) -- cpu_start == fn(ctx) == cpu_end
    |<---- phase 1, timed per dependency ---->|                          |<---- the task body ---->|

The task body is timed from inside the stream (lane) lock: the recorder hands the
engine a *shadow* of each ``BoundTask`` whose ``exec_fn`` (the task's function,
or its shortcut) is wrapped by a timer, so two tasks on one stream never show
overlapping spans. On an accelerator the wrapper also records a pair of timing
events on the task's stream (``device_start``/``device_end``). Times are seconds
since the run started (``fill_pipeline``), on ``time.perf_counter``'s clock.

Guarantees: a unit is recorded only once it completed; each task runs on one
worker thread, so its timer and wait slots have a single writer; appending to a
list is atomic, so workers need no lock to record.
"""

from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .charts import save_gantt
from .records import DependencyWait, PathLike, TaskRecord, TimelineData
from .stats import RunStats, summarize
from .trace_export import chrome_trace, write_chrome_trace

# The recorder works on the engine's tasks (``engine.runtime.BoundTask``: ``name``, ``index``, ``group``,
# ``stage``, ``stream_label``, ``exec_fn`` and ``spec``), which it takes as they are: the engine imports
# this module, never the reverse.
BoundTask = Any

__all__: List[str] = []

TraceSpec = Union[None, bool, str, "os.PathLike[str]"]  # run(trace=...): off, on, or on and written to a path


def parse_trace(trace: TraceSpec) -> Tuple[bool, Optional[PathLike]]:
    """``run(trace=...)`` as (record the timeline?, where to write the Chrome trace JSON or None).

    A path is checked before anything runs: it must not name a folder, and the nearest
    existing folder on its way must be writable (missing folders are made when it is written).
    """
    if trace is None or isinstance(trace, bool):
        return bool(trace), None
    if isinstance(trace, (str, os.PathLike)):
        path = os.fspath(trace)
        if not path:
            raise ValueError("trace: an empty path; pass a file name such as 'run.json', or True to record only")
        problem = None
        if os.path.isdir(path):
            problem = "it is a folder"
        else:
            ancestor = os.path.dirname(os.path.abspath(path))  # missing folders are made when the trace is written
            while not os.path.exists(ancestor):
                ancestor = os.path.dirname(ancestor)
            if not os.path.isdir(ancestor):
                problem = f"{ancestor!r} is a file, not a folder"
            elif not os.access(ancestor, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
                problem = "it is not writable"
        if problem is not None:
            raise ValueError(f"trace: cannot write the trace to {path!r}: {problem}; pass a writable file path, "
                             f"or True to record without writing")
        return True, trace
    raise TypeError(f"trace must be None, a bool, or a path to write the Chrome trace JSON to; "
                    f"got {type(trace).__name__}")


@dataclass(frozen=True)
class Timeline(TimelineData):
    """Every task execution of one traced run, with its summaries and pictures.

    Attributes:
        engine: ``"SWPipeline"`` or ``"DataFlowPipeline"``.
        device: the device the run used, e.g. ``"cpu"`` or ``"cuda:0"``.
        origin: ``time.perf_counter()`` at the start of the run (time 0 of every record).
        wall: seconds from the start of the run to its end.
        records: one TaskRecord per completed unit, ordered by ``cpu_start``.
        tasks: task names in serial order; thread_groups, streams: in plan order.
        intra_deps, inter_deps, globally_ordered: the plan's, or None when read from a
            trace that does not carry them.
    """

    def stats(self) -> "RunStats":
        """The per-task and per-run summary (see ``RunStats``)."""
        return summarize(self)

    def to_chrome_trace(self) -> Dict[str, Any]:
        """The timeline as a Chrome/Perfetto trace-event JSON object."""
        return chrome_trace(self)

    def save_chrome_trace(self, path: PathLike) -> None:
        """Write the Chrome/Perfetto trace JSON to ``path`` (open it at ui.perfetto.dev)."""
        write_chrome_trace(self, path)

    def save_chart(self, path: PathLike, *, iterations: Optional[Tuple[int, int]] = None,
                   title: Optional[str] = None) -> None:
        """Draw the timeline as a Gantt chart PNG (needs matplotlib: ``pip install swpipeline[plot]``).

        Args:
            path: the PNG file to write.
            iterations: ``(first, last)`` to draw only those iterations (inclusive); default all.
            title: the chart title; default names the engine, device and run size.
        """
        save_gantt(self, path, iterations=iterations, title=title)


# -- recording -----------------------------------------------------------------------------------

# (task index, iteration, period, ready, cpu_start, cpu_end, waits, device start event, device end event)
_Raw = Tuple[int, int, Optional[int], float, float, float, Optional[List[Tuple[int, int, float, float]]], Any, Any]


class Recorder:
    """Collects one traced run's units; ``timeline()`` turns them into a Timeline.

    Args:
        tasks: the run's BoundTasks (indexed by ``BoundTask.index``).
        serial_order: task names in serial order, for tables.
        engine: the engine's name.
        device: the device's name.
        new_timing_event: makes a device timing event, or None on devices without them.
        reference_stream: the stream on which the recorder marks the run's start for device times.
        caller: ``(thread group, thread name)`` of a group that runs on the caller's thread, if any.
    """

    def __init__(self, tasks: Sequence[BoundTask], serial_order: Sequence[str], engine: str, device: str,
                 new_timing_event: Optional[Callable[[], Any]] = None, reference_stream: Any = None,
                 caller: Optional[Tuple[str, str]] = None) -> None:
        self._tasks = list(tasks)
        self._caller = caller
        self._index = {t.name: t.index for t in self._tasks}
        self._serial_order = tuple(serial_order)
        self._engine, self._device = engine, device
        self._raw: List[_Raw] = []
        self._closed_at: Optional[float] = None
        self._cached: Tuple[Any, Optional[Timeline]] = (None, None)  # (key, timeline)
        self._new_event = new_timing_event
        self._reference: Any = None
        if new_timing_event is not None:  # device times are aligned to the CPU clock through this event
            self._reference = new_timing_event()
        self.origin = time.perf_counter()
        if self._reference is not None:
            self._reference.record(reference_stream)  # the device is idle: it reaches this about now
        # per task: [ready, cpu_start, cpu_end, device start event, device end event], and its phase-1 waits
        self._slots: List[List[Any]] = [[0.0, None, 0.0, None, None] for _ in self._tasks]
        self._waits: List[List[Tuple[int, int, float, float]]] = [[] for _ in self._tasks]
        self.runtimes: List[BoundTask] = [self._shadow(t) for t in self._tasks]

    def _shadow(self, task: BoundTask) -> BoundTask:
        """A copy of ``task`` whose executor (its function, or its shortcut) times itself into its slot."""
        shadow = copy.copy(task)
        shadow.exec_fn = self._timed(task.exec_fn, self._slots[task.index])
        return shadow

    def _timed(self, fn: Callable[[Any], Any], slot: List[Any]) -> Callable[[Any], None]:
        clock = time.perf_counter
        new_event = self._new_event
        if new_event is None:
            def timed(ctx: Any) -> None:
                slot[1] = clock()
                fn(ctx)
                slot[2] = clock()
            return timed

        def timed_on_device(ctx: Any) -> None:
            start, end = new_event(), new_event()
            start.record()  # on the current stream: the engine launched us with the task's stream current
            slot[1] = clock()
            fn(ctx)
            slot[2] = clock()
            end.record()
            slot[3], slot[4] = start, end
        return timed_on_device

    def timed_wait(self, wait: Callable[..., None]) -> Callable[..., None]:
        """``wait`` (a phase-1 wait), timed into the waiting task's slot."""
        clock, index, waits = time.perf_counter, self._index, self._waits

        def timed(dep: int, dep_iter: int, timeout: float, waiter: str, waiter_iter: int) -> None:
            start = clock()
            wait(dep, dep_iter, timeout, waiter, waiter_iter)
            waits[index[waiter]].append((dep, dep_iter, start, clock()))
        return timed

    def begin(self, index: int) -> None:
        """A unit of task ``index`` was picked up: note the time, forget the previous unit's waits."""
        slot = self._slots[index]
        slot[0], slot[1] = time.perf_counter(), None
        self._waits[index] = []

    def add(self, index: int, iter_idx: int, period: Optional[int]) -> None:
        """Record the unit just completed (called on its worker thread right after it ran)."""
        ready, start, end, dev_start, dev_end = self._slots[index]
        waits = self._waits[index] or None
        if start is None:  # the function did not run (cannot happen for a completed unit): time the whole unit
            start, end, dev_start, dev_end = waits[-1][3] if waits else ready, time.perf_counter(), None, None
        self._raw.append((index, iter_idx, period, ready, start, end, waits, dev_start, dev_end))

    def close(self) -> None:
        """Mark the end of the run (its wall time ends here)."""
        if self._closed_at is None:
            self._closed_at = time.perf_counter()

    def timeline(self) -> Timeline:
        """The Timeline of what was recorded so far (waits for device timing events to complete)."""
        raw = list(self._raw)
        key, cached = self._cached
        if cached is not None and key == (len(raw), self._closed_at):
            return cached
        origin = self.origin
        names = [t.name for t in self._tasks]
        caller_group, caller_thread = self._caller or (None, "")
        records = []
        for index, iter_idx, period, ready, start, end, waits, dev_start, dev_end in raw:
            task = self._tasks[index]
            device_times = self._device_times(dev_start, dev_end)
            records.append(TaskRecord(
                task=task.name, iteration=iter_idx, thread_group=task.group, stream=task.stream_label,
                stage=task.stage, period=period, ready=ready - origin, cpu_start=start - origin,
                cpu_end=end - origin,
                waits=tuple(DependencyWait(names[d], d_iter, w0 - origin, w1 - origin)
                            for d, d_iter, w0, w1 in waits or ()),
                device_start=device_times[0], device_end=device_times[1],
                thread_name=caller_thread if task.group == caller_group else ""))
        records.sort(key=lambda r: (r.cpu_start, r.cpu_end))
        last_end = max((r.cpu_end for r in records), default=0.0)
        wall = self._closed_at - origin if self._closed_at is not None else last_end
        timeline = Timeline(
            engine=self._engine, device=self._device, origin=origin, wall=max(wall, last_end),
            records=tuple(records),
            tasks=self._serial_order, thread_groups=tuple(dict.fromkeys(t.group for t in self._tasks)),
            streams=tuple(dict.fromkeys(t.stream_label for t in self._tasks)),
            intra_deps=tuple((t.name, names[d]) for t in self._tasks for d, _ in t.spec.intra_deps),
            inter_deps=tuple((t.name, names[d]) if back == 1 else (t.name, names[d], back)  # as declared
                             for t in self._tasks for d, _, back in t.spec.inter_deps),
            globally_ordered=tuple(t.name for t in self._tasks if t.spec.globally_ordered))
        self._cached = ((len(raw), self._closed_at), timeline)
        return timeline

    def _device_times(self, start: Any, end: Any) -> Tuple[Optional[float], Optional[float]]:
        """Device start/end in seconds since the run started, from timing events (None without them)."""
        if start is None or end is None or self._reference is None:
            return None, None
        end.synchronize()
        return (self._reference.elapsed_time(start) / 1e3, self._reference.elapsed_time(end) / 1e3)
