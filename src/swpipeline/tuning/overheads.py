"""What the engine itself costs: the constants the simulator adds to the tasks' own costs.

On short tasks the engine's own time matters: the thread that calls ``progress()``
(the *caller*) fetches each batch and hands each thread group its units, and a
thread that waits (for work in its queue, for a dependency, for its turn, for the
oldest iteration) runs again only a moment after it is signalled::

    caller   |fetch+hand out P3|..wait..|retire i1|fetch+hand out P4|
                     \\ put                   ^ i1's last task done (+wake)
    worker          (+wake) |unit|A(i2)|unit|B(i2)|...
                                  ^ the engine's cost per unit, outside the task

``EngineOverheads()`` holds constants measured on a 2-core x86 VM (Python 3.11, torch
CPU); ``EngineOverheads.zero()`` turns them all off (whole timelines then follow from
the task costs alone); ``calibrate()`` (in ``calibrate.py``) measures them on this machine.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Dict, List, Optional, Set

if TYPE_CHECKING:
    from ..observe.records import TimelineData

__all__: List[str] = []


@dataclass(frozen=True)
class EngineOverheads:
    """The engine's own costs, in seconds, which the simulator adds to the tasks' own costs.

    ``EngineOverheads()`` holds constants measured on a 2-core x86 VM (Python 3.11, torch
    CPU); ``EngineOverheads.zero()`` turns them all off; ``calibrate()`` measures them on
    this machine.

    Args:
        wake: from one thread signalling (a queue put, a task completing, a turn passing
            on) to a thread blocked on it running again.
        unit: a worker's cost per unit of work outside the task's function (dependency
            checks, completion, the lane).
        period: the caller's cost per period handed out: fetching the batch, making its
            context, handing each thread group its units (not counting the data iterator's
            own time, which ``simulate(data_seconds=...)`` adds).
        retire: the caller's cost per ``progress()`` call (retiring the oldest iteration).
        thread_start: starting one worker thread, at ``fill_pipeline()``.
        thread_stop: stopping and joining one worker thread at the end of the run.
        serial_unit: ``run_serial``'s cost per task call.

    Raises:
        TypeError, ValueError: a value that is not a finite number of seconds >= 0.
    """

    wake: float = 40e-6
    unit: float = 4e-6
    period: float = 12e-6
    retire: float = 6e-6
    thread_start: float = 150e-6
    thread_stop: float = 80e-6
    serial_unit: float = 0.3e-6

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"EngineOverheads.{f.name} must be a number of seconds, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"EngineOverheads.{f.name} must be a finite number of seconds >= 0, got {value!r}")
            object.__setattr__(self, f.name, float(value))

    @classmethod
    def zero(cls) -> "EngineOverheads":
        """No engine cost at all: a simulation then follows from the task costs alone."""
        return cls(**{f.name: 0.0 for f in fields(cls)})

    @classmethod
    def from_timeline(cls, timeline: "TimelineData", base: Optional["EngineOverheads"] = None,
                      min_samples: int = 20) -> "EngineOverheads":
        """``base`` (default ``EngineOverheads()``) with ``wake`` and ``unit`` as a traced run measured them.

        ``wake``: the median, over the units that waited for a dependency, of the time from the end
        of the last dependency they waited for to their start. ``unit``: the median time from the
        end of a unit to the start of the next on the same thread, when that one waited for
        nothing and followed within a millisecond (it was queued already). Either keeps ``base``'s
        value when fewer than ``min_samples`` units show it. The caller's costs are not in a
        trace and stay ``base``'s.
        """
        base = base if base is not None else cls()
        groups_on: Dict[str, Set[str]] = {}
        for r in timeline.records:
            groups_on.setdefault(r.stream, set()).add(r.thread_group)
        takes_turns = {stream for stream, groups in groups_on.items() if len(groups) > 1}
        ends = {(r.task, r.iteration): r.cpu_end for r in timeline.records}
        woken, gaps = [], []
        by_thread: Dict[str, float] = {}
        for r in sorted(timeline.records, key=lambda r: r.cpu_start):
            prev, by_thread[r.thread_group] = by_thread.get(r.thread_group), r.cpu_end
            if r.stream in takes_turns:  # its start also waited for its turn on the stream
                continue
            if r.waits:
                last = max(r.waits, key=lambda w: w.end)
                end = ends.get((last.task, last.iteration))
                if end is not None and r.cpu_start >= end:
                    woken.append(r.cpu_start - end)
            elif prev is not None and 0 <= r.cpu_start - prev < 1e-3:
                gaps.append(r.cpu_start - prev)
        wake = statistics.median(woken) if len(woken) >= min_samples else base.wake
        unit = statistics.median(gaps) if len(gaps) >= min_samples else base.unit
        return replace(base, wake=wake, unit=unit)

    def format(self) -> str:
        """One line: every constant in microseconds."""
        return ", ".join(f"{f.name} {getattr(self, f.name) * 1e6:.1f} us" for f in fields(self))
