"""A Timeline as Chrome trace-event JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open.

Layout of the trace::

    process 1 "swpipeline threads"   one track per thread group (thread name swp-<group>, or the
                                     caller's thread's name and the group for a group run there):
                                     task spans (cat "task") and dependency waits (cat "dependency_wait")
    process 2 "swpipeline streams"   one track per stream: the task spans on that stream, from device
                                     timing events where recorded (cat "device"), else the CPU spans

Every span is a complete event (``"ph": "X"``) with ``name``, ``ts`` and ``dur`` in
microseconds since the run started, ``pid`` and ``tid``; the iteration, period,
stage and the waits are in ``args``. Timestamps are whole nanoseconds written as
microseconds, so spans that do not overlap in the timeline do not overlap here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List

if TYPE_CHECKING:
    from .records import PathLike, TaskRecord, TimelineData as Timeline

__all__: List[str] = []

THREADS_PID, STREAMS_PID = 1, 2


def _span(name: str, cat: str, start: float, end: float, pid: int, tid: int,
          args: Dict[str, Any]) -> Dict[str, Any]:
    """A complete event from ``start`` to ``end`` (seconds), in microseconds rounded to whole nanoseconds."""
    start_ns, end_ns = round(start * 1e9), round(end * 1e9)
    return {"name": name, "cat": cat, "ph": "X", "ts": start_ns / 1e3, "dur": (end_ns - start_ns) / 1e3,
            "pid": pid, "tid": tid, "args": args}


def _metadata(kind: str, pid: int, tid: int, value: Any) -> Dict[str, Any]:
    key = "sort_index" if kind.endswith("sort_index") else "name"
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {key: value}}


def _task_args(record: "TaskRecord") -> Dict[str, Any]:
    args: Dict[str, Any] = {"iteration": record.iteration, "stage": record.stage,
                            "thread_group": record.thread_group, "stream": record.stream}
    if record.period is not None:
        args["period"] = record.period
    args["wait_ms"] = round(record.wait * 1e3, 6)
    args["waits_ms"] = {f"{w.task}(i{w.iteration})": round(w.duration * 1e3, 6) for w in record.waits}
    return args


def chrome_trace(timeline: "Timeline") -> Dict[str, Any]:
    """The trace-event JSON object (``{"traceEvents": [...], ...}``) of ``timeline``."""
    thread_tid = {g: k + 1 for k, g in enumerate(timeline.thread_groups)}
    stream_tid = {s: k + 1 for k, s in enumerate(timeline.streams)}
    events: List[Dict[str, Any]] = [
        _metadata("process_name", THREADS_PID, 0, "swpipeline threads"),
        _metadata("process_sort_index", THREADS_PID, 0, THREADS_PID),
        _metadata("process_name", STREAMS_PID, 0,
                  "swpipeline streams (device)" if timeline.has_device_times else "swpipeline streams"),
        _metadata("process_sort_index", STREAMS_PID, 0, STREAMS_PID),
    ]
    for group, tid in thread_tid.items():
        events += [_metadata("thread_name", THREADS_PID, tid, timeline.thread_label(group)),
                   _metadata("thread_sort_index", THREADS_PID, tid, tid)]
    for stream, tid in stream_tid.items():
        events += [_metadata("thread_name", STREAMS_PID, tid, f"stream {stream}"),
                   _metadata("thread_sort_index", STREAMS_PID, tid, tid)]
    for record in timeline.records:
        tid = thread_tid[record.thread_group]
        args = _task_args(record)
        for wait in record.waits:
            events.append(_span(f"wait {wait.task}", "dependency_wait", wait.start, wait.end, THREADS_PID, tid,
                                {"task": record.task, "iteration": record.iteration, "dependency": wait.task,
                                 "dependency_iteration": wait.iteration}))
        events.append(_span(record.task, "task", record.cpu_start, record.cpu_end, THREADS_PID, tid, args))
        track = stream_tid[record.stream]
        if record.device_start is not None and record.device_end is not None:
            events.append(_span(record.task, "device", record.device_start, record.device_end, STREAMS_PID,
                                track, args))
        else:
            events.append(_span(record.task, "task", record.cpu_start, record.cpu_end, STREAMS_PID, track, args))
    trace: Dict[str, Any] = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"engine": timeline.engine, "device": timeline.device,
                      "iterations": timeline.num_iterations, "wall_ms": round(timeline.wall * 1e3, 3)},
    }
    if timeline.intra_deps is not None and timeline.inter_deps is not None:  # the plan's, when known
        trace["otherData"]["plan"] = {"intra": [list(p) for p in timeline.intra_deps],
                                      "inter": [list(p) for p in timeline.inter_deps],
                                      "globally_ordered": list(timeline.globally_ordered or ())}
    return trace


def write_chrome_trace(timeline: "Timeline", path: "PathLike") -> None:
    """Write ``chrome_trace(timeline)`` to ``path`` (creating its folder)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w", encoding="utf-8") as out:
        json.dump(chrome_trace(timeline), out, separators=(",", ":"))
