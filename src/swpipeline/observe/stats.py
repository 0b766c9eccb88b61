"""Run statistics from a Timeline: per task (durations, waits, share) and per run (throughput, bubbles).

Definitions (all from the recorded timeline, nothing sampled):

* a task's *duration* is its function's CPU time span (``cpu_end - cpu_start``); its
  *wait* is the time it spent blocked on dependencies (phase 1) before running;
* *share of wall* is the task's summed duration over the run's wall time: the
  shares of the tasks on one thread add up to that thread's busy fraction;
* a lane's *idle fraction* (its bubbles) is the share of the wall time in which
  no task ran on it: per thread group from CPU spans, per stream from device spans
  where the run recorded them, else from CPU spans.
"""

from __future__ import annotations

import math
import statistics
from .tables import text_table as _table
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Dict, Iterable, List, Mapping, Sequence, Tuple

if TYPE_CHECKING:
    from .records import TaskRecord, TimelineData as Timeline

__all__: List[str] = []


@dataclass(frozen=True)
class TaskStats:
    """One task's executions in a run (seconds).

    ``median_wait`` is the median over its executions of the time each spent blocked
    on its dependencies; ``share_of_wall`` is its summed duration over the run's wall time.
    """

    task: str
    thread_group: str
    stream: str
    count: int
    median: float
    p95: float
    median_wait: float
    share_of_wall: float


@dataclass(frozen=True)
class RunStats:
    """The summary of one traced run; ``str(stats)`` is a printable table.

    Attributes:
        engine, device: as in the Timeline.
        iterations: iterations with at least one recorded task.
        wall: the run's wall time in seconds.
        throughput: iterations per second of wall time.
        tasks: one TaskStats per task that ran, in serial order.
        thread_idle: thread group -> fraction of the wall time its worker ran no task.
        stream_idle: stream -> fraction of the wall time no task ran on it.
        shared_streams: stream -> the thread groups whose tasks ran on it, for each stream
            used by more than one thread group (their tasks took turns on it: they never overlap).
    """

    engine: str
    device: str
    iterations: int
    wall: float
    throughput: float
    tasks: Tuple[TaskStats, ...]
    thread_idle: Mapping[str, float]
    stream_idle: Mapping[str, float]
    shared_streams: Mapping[str, Tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))

    def task(self, name: str) -> TaskStats:
        """The TaskStats of task ``name``."""
        for stats in self.tasks:
            if stats.task == name:
                return stats
        raise KeyError(f"no task {name!r} ran in this run; tasks: {[s.task for s in self.tasks]}")

    def format(self) -> str:
        """The statistics as plain-text tables."""
        return format_stats(self)

    def __str__(self) -> str:
        return format_stats(self)


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of a non-empty sequence (``fraction`` in (0, 1])."""
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def busy_time(spans: Iterable[Tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(spans):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def _stream_span(record: "TaskRecord") -> Tuple[float, float]:
    if record.device_start is not None and record.device_end is not None:
        return record.device_start, record.device_end
    return record.cpu_start, record.cpu_end


def summarize(timeline: "Timeline") -> RunStats:
    """The RunStats of ``timeline``."""
    wall = timeline.wall
    by_task: Dict[str, List["TaskRecord"]] = {}
    for record in timeline.records:
        by_task.setdefault(record.task, []).append(record)
    tasks = []
    for name in timeline.tasks:
        runs = by_task.get(name)
        if not runs:
            continue
        durations = [r.duration for r in runs]
        tasks.append(TaskStats(
            task=name, thread_group=runs[0].thread_group, stream=runs[0].stream, count=len(runs),
            median=statistics.median(durations), p95=percentile(durations, 0.95),
            median_wait=statistics.median(r.wait for r in runs),
            share_of_wall=sum(durations) / wall if wall > 0 else 0.0))

    thread_spans: Dict[str, List[Tuple[float, float]]] = {g: [] for g in timeline.thread_groups}
    stream_spans: Dict[str, List[Tuple[float, float]]] = {s: [] for s in timeline.streams}
    groups_on: Dict[str, Dict[str, None]] = {}  # stream -> the thread groups that ran on it, in order
    for record in timeline.records:
        thread_spans.setdefault(record.thread_group, []).append((record.cpu_start, record.cpu_end))
        stream_spans.setdefault(record.stream, []).append(_stream_span(record))
        groups_on.setdefault(record.stream, {})[record.thread_group] = None
    shared = MappingProxyType({s: tuple(g) for s, g in groups_on.items() if len(g) > 1})
    iterations = timeline.num_iterations
    return RunStats(
        engine=timeline.engine, device=timeline.device, iterations=iterations, wall=wall,
        throughput=iterations / wall if wall > 0 else 0.0, tasks=tuple(tasks),
        thread_idle=_idle_fractions(thread_spans, wall), stream_idle=_idle_fractions(stream_spans, wall),
        shared_streams=shared)


def _idle_fractions(spans: Mapping[str, Sequence[Tuple[float, float]]], wall: float) -> Mapping[str, float]:
    """Lane -> fraction of ``wall`` not covered by the lane's spans (read-only)."""
    return MappingProxyType({lane: max(0.0, 1.0 - busy_time(s) / wall) if wall > 0 else 0.0
                             for lane, s in spans.items()})


def format_stats(stats: RunStats) -> str:
    """The ``RunStats`` report: a headline, the per-task table and the per-lane bubbles.

    Example::

        SWPipeline on cpu: 200 iterations in 2.091 s, 95.6 iterations/s (10.46 ms/iteration)

        task          thread  stream  runs  median ms  p95 ms  median wait ms  share of wall
        ------------  ------  ------  ----  ---------  ------  --------------  -------------
        PrepareBatch  prep    prep     200      9.612  10.013           0.000          91.9%
    """
    per_iter = f", {stats.wall / stats.iterations * 1e3:.2f} ms/iteration" if stats.iterations else ""
    lines = [f"{stats.engine} on {stats.device}: {stats.iterations} iterations in {stats.wall:.3f} s, "
             f"{stats.throughput:.1f} iterations/s{per_iter}", ""]
    rows = [[t.task, t.thread_group, t.stream, str(t.count), f"{t.median * 1e3:.3f}", f"{t.p95 * 1e3:.3f}",
             f"{t.median_wait * 1e3:.3f}", f"{t.share_of_wall:.1%}"] for t in stats.tasks]
    lines += _table(["task", "thread", "stream", "runs", "median ms", "p95 ms", "median wait ms", "share of wall"],
                    rows, left=3)
    lines.append("")
    lanes = [[f"thread {name}", f"{1 - idle:.1%}", f"{idle:.1%}"] for name, idle in stats.thread_idle.items()]
    lanes += [[f"stream {name}", f"{1 - idle:.1%}", f"{idle:.1%}"] for name, idle in stats.stream_idle.items()]
    lines += _table(["lane", "busy", "idle (bubbles)"], lanes, left=1)
    for stream, groups in stats.shared_streams.items():
        lines.append(f"stream {stream} is shared by thread groups {', '.join(groups)}: their tasks took turns on "
                     f"it and never overlapped; give each group its own stream to let them")
    return "\n".join(lines)
