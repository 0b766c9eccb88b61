"""Plain records of a traced run: what each task execution did, and the run's timeline data.

A leaf module: the statistics, the trace export and the charts read these records,
and ``timeline.py`` builds them; nothing here imports any of those.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

__all__: List[str] = []

PathLike = Union[str, "os.PathLike[str]"]


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

    ``cpu_start``/``cpu_end`` bracket the task function on the thread that ran it (its
    group's worker, or the caller's thread for a group run there: ``thread``);
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
    thread_name: str = ""  # the thread that ran it when that was not its group's worker (the caller's)

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
        """The name of the thread that ran it: ``swp-<group>`` for a worker, else the caller's thread's."""
        return self.thread_name or f"swp-{self.thread_group}"


@dataclass(frozen=True)
class TimelineData:
    """Every task execution of one traced run (the data; ``Timeline`` adds the summaries and pictures).

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
        intra_deps, inter_deps: the plan's dependencies as ``(task, depends_on)`` pairs (an
            inter-iteration one at a distance d > 1: ``(task, depends_on, d)``), and
        globally_ordered: its globally ordered tasks; None where unknown (a timeline read
        from a trace that does not carry them).
    """

    engine: str
    device: str
    origin: float
    wall: float
    records: Tuple[TaskRecord, ...]
    tasks: Tuple[str, ...]
    thread_groups: Tuple[str, ...]
    streams: Tuple[str, ...]
    intra_deps: Optional[Tuple[Tuple[str, str], ...]] = None
    inter_deps: Optional[Tuple[Union[Tuple[str, str], Tuple[str, str, int]], ...]] = None
    globally_ordered: Optional[Tuple[str, ...]] = None

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

    def thread_label(self, group: str) -> str:
        """How a thread group's lane is named: ``swp-<group>`` for its worker, or the thread that ran it
        instead and the group, e.g. ``MainThread (default)`` for a group run on the caller's thread."""
        ran_on = next((r.thread_name for r in self.records if r.thread_group == group), "")
        return f"{ran_on} ({group})" if ran_on else f"swp-{group}"
