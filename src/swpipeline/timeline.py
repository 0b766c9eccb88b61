"""Timelines: what ran where and when, recorded only when asked for.

A ``Recorder`` is made only for a traced fill (``run(trace=...)``,
``run(verbose=True)`` or ``with pipe.tracing():``); the engine then hands its
workers ``_run_unit_recorded`` instead of ``_run_unit``, so an untraced run executes
exactly the code it did before this module existed. For every unit the recorded
path notes::

    ready -- wait A(i) -- wait B(i-1) -- (phase 2, sequencer, stream) -- cpu_start == fn(ctx) == cpu_end
    |<---- phase 1, timed per dependency ---->|                          |<---- the task body ---->|

The task body is timed from inside the stream (lane) lock: the recorder hands the
engine a *shadow* of each ``TaskRuntime`` whose ``exec_fn`` (the task's function,
or its shortcut) is wrapped by a timer, so two tasks on one stream never show
overlapping spans. On an
accelerator the wrapper also records a pair of timing events on the task's stream
(``device_start``/``device_end``). Times are seconds since the run started
(``fill_pipeline``), on ``time.perf_counter``'s clock.

Guarantees: a unit is recorded only once it completed; each task runs on one
worker thread, so its timer slot has a single writer; appending to a list is
atomic, so workers need no lock to record.
"""

from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .runtime import TaskRuntime

if TYPE_CHECKING:
    from .stats import RunStats

__all__: List[str] = []

PathLike = Union[str, "os.PathLike[str]"]
TraceSpec = Union[None, bool, str, "os.PathLike[str]"]  # run(trace=...): off, on, or on and written to a path


def parse_trace(trace: TraceSpec) -> Tuple[bool, Optional[PathLike]]:
    """``run(trace=...)`` as (record the timeline?, where to write the Chrome trace JSON or None)."""
    if trace is None or isinstance(trace, bool):
        return bool(trace), None
    if isinstance(trace, (str, os.PathLike)):
        if not os.fspath(trace):
            raise ValueError("trace: an empty path; pass a file name such as 'run.json', or True to record only")
        return True, trace
    raise TypeError(f"trace must be None, a bool, or a path to write the Chrome trace JSON to; "
                    f"got {type(trace).__name__}")


@dataclass(frozen=True)
class DependencyWait:
    """Time a task execution spent blocked in phase 1 on one dependency (seconds since the run started).

    Only dependencies that were not yet done when the unit was picked up are listed.
    """

    task: str  # the dependency (producer)
    iteration: int  # the producer's iteration: the consumer's (intra) or the one before (inter)
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class TaskRecord:
    """One task execution: where it ran, on which iteration, and when (seconds since the run started).

    ``cpu_start``/``cpu_end`` bracket the task function on its worker thread;
    ``ready`` is when the worker picked the unit up, before its dependency waits;
    ``device_start``/``device_end`` come from timing events on the task's stream
    (accelerators only, else None). ``period`` is the SWPipeline clock period (None
    for the data-flow engine).
    """

    task: str
    iteration: int
    thread_group: str
    stream: str
    stage: int
    period: Optional[int]
    ready: float
    cpu_start: float
    cpu_end: float
    waits: Tuple[DependencyWait, ...] = ()
    device_start: Optional[float] = None
    device_end: Optional[float] = None

    @property
    def duration(self) -> float:
        """Seconds the task function ran on the CPU."""
        return self.cpu_end - self.cpu_start

    @property
    def wait(self) -> float:
        """Seconds spent blocked on dependencies (phase 1) before it could run."""
        return sum(w.duration for w in self.waits)

    @property
    def thread(self) -> str:
        """The worker thread's name."""
        return f"swp-{self.thread_group}"


@dataclass(frozen=True)
class Timeline:
    """Every task execution of one traced run.

    Attributes:
        engine: ``"SWPipeline"`` or ``"DataFlowPipeline"``.
        device: the device the run used, e.g. ``"cpu"`` or ``"cuda:0"``.
        origin: ``time.perf_counter()`` at the start of the run (time 0 of every record), to
            compare the records with one's own ``perf_counter`` stamps.
        wall: seconds from the start of the run to its end (or to the last task's end).
        records: one TaskRecord per completed unit, ordered by ``cpu_start``.
        tasks: task names in serial (topological) order.
        thread_groups: thread group names, in order of first appearance in the plan.
        streams: stream labels, in order of first appearance in the plan.
    """

    engine: str
    device: str
    origin: float
    wall: float
    records: Tuple[TaskRecord, ...]
    tasks: Tuple[str, ...]
    thread_groups: Tuple[str, ...]
    streams: Tuple[str, ...]

    @property
    def num_iterations(self) -> int:
        """How many distinct iterations have at least one recorded task."""
        return len({r.iteration for r in self.records})

    @property
    def has_device_times(self) -> bool:
        return any(r.device_start is not None for r in self.records)

    def for_task(self, name: str) -> List[TaskRecord]:
        """The records of one task, in iteration order."""
        return sorted((r for r in self.records if r.task == name), key=lambda r: r.iteration)

    def stats(self) -> "RunStats":
        """The per-task and per-run summary (see ``RunStats``)."""
        from .stats import summarize

        return summarize(self)

    def to_chrome_trace(self) -> Dict[str, Any]:
        """The timeline as a Chrome/Perfetto trace-event JSON object."""
        from .trace_export import chrome_trace

        return chrome_trace(self)

    def save_chrome_trace(self, path: PathLike) -> None:
        """Write the Chrome/Perfetto trace JSON to ``path`` (open it at ui.perfetto.dev)."""
        from .trace_export import write_chrome_trace

        write_chrome_trace(self, path)

    def save_chart(self, path: PathLike, *, iterations: Optional[Tuple[int, int]] = None,
                   title: Optional[str] = None) -> None:
        """Draw the timeline as a Gantt chart PNG (needs matplotlib: ``pip install swpipeline[plot]``).

        Args:
            path: the PNG file to write.
            iterations: ``(first, last)`` to draw only those iterations (inclusive); default all.
            title: the chart title; default names the engine, device and run size.
        """
        from .charts import save_gantt

        save_gantt(self, path, iterations=iterations, title=title)


# -- recording -----------------------------------------------------------------------------------

# (task index, iteration, period, ready, cpu_start, cpu_end, waits, device start event, device end event)
_Raw = Tuple[int, int, Optional[int], float, float, float, Optional[List[Tuple[int, int, float, float]]], Any, Any]


class Recorder:
    """Collects one traced run's units; ``timeline()`` turns them into a Timeline.

    Args:
        tasks: the engine's TaskRuntimes (indexed by ``TaskRuntime.index``).
        serial_order: task names in serial order, for tables.
        engine: the engine's name.
        device: the device's name.
        new_timing_event: makes a device timing event, or None on devices without them.
        reference_stream: the stream on which the recorder marks the run's start for device times.
    """

    def __init__(self, tasks: Sequence[TaskRuntime], serial_order: Sequence[str], engine: str, device: str,
                 new_timing_event: Optional[Callable[[], Any]] = None, reference_stream: Any = None) -> None:
        self._tasks = list(tasks)
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
        # per task: [cpu_start, cpu_end, device start event, device end event], written by the timed function
        self._slots: List[List[Any]] = [[0.0, 0.0, None, None] for _ in self._tasks]
        self.runtimes: List[TaskRuntime] = [self._shadow(t) for t in self._tasks]

    def _shadow(self, task: TaskRuntime) -> TaskRuntime:
        """A copy of ``task`` whose executor (its function, or its shortcut) times itself into its slot."""
        shadow = copy.copy(task)
        shadow.exec_fn = self._timed(task.exec_fn, self._slots[task.index])
        return shadow

    def _timed(self, fn: Callable[[Any], Any], slot: List[Any]) -> Callable[[Any], None]:
        clock = time.perf_counter
        new_event = self._new_event
        if new_event is None:
            def timed(ctx: Any) -> None:
                slot[0] = clock()
                fn(ctx)
                slot[1] = clock()
            return timed

        def timed_on_device(ctx: Any) -> None:
            start, end = new_event(), new_event()
            start.record()  # on the current stream: the engine launched us with the task's stream current
            slot[0] = clock()
            fn(ctx)
            slot[1] = clock()
            end.record()
            slot[2], slot[3] = start, end
        return timed_on_device

    def begin(self, index: int) -> None:
        """Mark the task's slot unused, so ``add`` can tell whether the timed function ran."""
        self._slots[index][0] = None

    def add(self, index: int, iter_idx: int, period: Optional[int], ready: float, deps_done: float,
            waits: Optional[List[Tuple[int, int, float, float]]]) -> None:
        """Record a completed unit (called on its worker thread right after it ran)."""
        slot = self._slots[index]
        start = slot[0]
        if start is None:  # the executor was not called (a subclass launched differently): time the launch
            start, end, dev = deps_done, time.perf_counter(), (None, None)
        else:
            end, dev = slot[1], (slot[2], slot[3])
        self._raw.append((index, iter_idx, period, ready, start, end, waits, dev[0], dev[1]))

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
                device_start=device_times[0], device_end=device_times[1]))
        records.sort(key=lambda r: (r.cpu_start, r.cpu_end))
        last_end = max((r.cpu_end for r in records), default=0.0)
        wall = self._closed_at - origin if self._closed_at is not None else last_end
        timeline = Timeline(
            engine=self._engine, device=self._device, origin=origin, wall=max(wall, last_end),
            records=tuple(records),
            tasks=self._serial_order, thread_groups=tuple(dict.fromkeys(t.group for t in self._tasks)),
            streams=tuple(dict.fromkeys(t.stream_label for t in self._tasks)))
        self._cached = ((len(raw), self._closed_at), timeline)
        return timeline

    def _device_times(self, start: Any, end: Any) -> Tuple[Optional[float], Optional[float]]:
        """Device start/end in seconds since the run started, from timing events (None without them)."""
        if start is None or end is None or self._reference is None:
            return None, None
        end.synchronize()
        return (self._reference.elapsed_time(start) / 1e3, self._reference.elapsed_time(end) / 1e3)
