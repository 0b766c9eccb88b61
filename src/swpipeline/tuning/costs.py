"""What each task costs: ``TaskCost`` and ``TaskCosts``, the input of the simulator and the planner.

A task's cost is the time its function takes on its thread (``seconds``) and, on an
accelerator, the time its work takes on its stream (``device``). Both are typical
values (the median of a run); ``samples`` optionally keep one value per iteration,
in iteration order, so that a simulation can replay a run's jitter.

Three ways to get them:

* from a traced run: ``TaskCosts.from_timeline(pipe.timeline)`` (``run(trace=True)``);
* from ``TaskProfiler``: ``TaskCosts.from_profile(result)`` (exposed time per task);
* by hand: ``TaskCosts({"Forward": 3e-3, "Backward": 6e-3})``, or a plain dict
  wherever costs are accepted.

``costs.replace(Forward=0)`` asks "what if this task cost nothing".
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

if TYPE_CHECKING:
    from .profiler import ProfileResult
    from ..observe.records import TimelineData

__all__: List[str] = []


def _seconds(where: str, value: object) -> float:
    """A cost in seconds: a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where}: a cost must be a number of seconds, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: a cost must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def _samples(where: str, values: object) -> Tuple[float, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise TypeError(f"{where}: samples must be a list or tuple of seconds, got {type(values).__name__}")
    return tuple(_seconds(f"{where}[{k}]", v) for k, v in enumerate(values))


@dataclass(frozen=True)
class TaskCost:
    """What one task costs, in seconds.

    Args:
        seconds: the typical time of the task's function on its worker thread (on the
            CPU device this is also its time on its stream, which is a lane).
        device: the typical time of its work on its stream (accelerators); None when the
            task's work is all on the thread.
        samples: optional per-iteration thread times, in iteration order; a simulation
            with jitter uses ``samples[i % len(samples)]`` for iteration ``i``.
        device_samples: the same for the device time.

    Raises:
        TypeError, ValueError: a value that is not a finite number of seconds >= 0.
    """

    seconds: float
    device: Optional[float] = None
    samples: Tuple[float, ...] = ()
    device_samples: Tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "seconds", _seconds("TaskCost.seconds", self.seconds))
        if self.device is not None:
            object.__setattr__(self, "device", _seconds("TaskCost.device", self.device))
        object.__setattr__(self, "samples", _samples("TaskCost.samples", self.samples))
        object.__setattr__(self, "device_samples", _samples("TaskCost.device_samples", self.device_samples))
        if self.device_samples and self.device is None:
            raise ValueError("TaskCost: device_samples given without device; give the typical device time too")

    def thread_times(self, num_iterations: int, jitter: bool) -> List[float]:
        """The thread time of iterations ``0 .. num_iterations-1`` (samples, cycled, if ``jitter``)."""
        if jitter and self.samples:
            return [self.samples[i % len(self.samples)] for i in range(num_iterations)]
        return [self.seconds] * num_iterations

    def device_times(self, num_iterations: int, jitter: bool) -> Optional[List[float]]:
        """The device time of each iteration, or None for a task without device work."""
        if self.device is None:
            return None
        if jitter and self.device_samples:
            return [self.device_samples[i % len(self.device_samples)] for i in range(num_iterations)]
        return [self.device] * num_iterations

    @property
    def p95(self) -> float:
        """The 95th percentile of the samples (``seconds`` without samples)."""
        if not self.samples:
            return self.seconds
        ordered = sorted(self.samples)
        return ordered[max(1, math.ceil(0.95 * len(ordered))) - 1]

    @property
    def spread(self) -> float:
        """Variability: the samples' standard deviation over their mean (0 without samples)."""
        if len(self.samples) < 2:
            return 0.0
        mean = statistics.fmean(self.samples)
        return statistics.stdev(self.samples) / mean if mean > 0 else 0.0


CostLike = Union[float, int, TaskCost]


class TaskCosts(Mapping[str, TaskCost]):
    """Task name -> ``TaskCost``: what a plan's tasks cost (read-only; ``replace`` makes a changed copy).

    Args:
        costs: task name -> seconds, or -> ``TaskCost``.
        **more: more task name -> cost pairs.

    Raises:
        TypeError: a name that is not a string, or a cost that is not seconds or a TaskCost.
        ValueError: a negative or non-finite cost.

    Example::

        costs = TaskCosts({"Prepare": 9e-3, "Forward": 3e-3, "Backward": 6e-3})
        simulate(plan, costs.replace(Prepare=0))      # what if preparing a batch were free?
    """

    def __init__(self, costs: Optional[Mapping[str, CostLike]] = None, **more: CostLike) -> None:
        merged: Dict[str, CostLike] = {}
        if costs is not None:
            if not isinstance(costs, Mapping):
                raise TypeError(f"TaskCosts: costs must be a mapping of task name -> seconds, got "
                                f"{type(costs).__name__}")
            merged.update(costs)
        merged.update(more)
        self._costs: Dict[str, TaskCost] = {}
        for name, cost in merged.items():
            if not isinstance(name, str):
                raise TypeError(f"TaskCosts: task names must be strings, got {type(name).__name__} {name!r}")
            self._costs[name] = cost if isinstance(cost, TaskCost) else TaskCost(_seconds(f"costs[{name!r}]", cost))

    # -- sources -------------------------------------------------------------------------------

    @classmethod
    def coerce(cls, costs: object) -> "TaskCosts":
        """``costs`` as TaskCosts: a TaskCosts as it is, a dict of name -> seconds (or TaskCost) converted.

        Raises:
            TypeError: anything else.
        """
        if isinstance(costs, TaskCosts):
            return costs
        if isinstance(costs, Mapping):
            return cls(costs)
        raise TypeError(f"costs must be a TaskCosts or a dict of task name -> seconds, got {type(costs).__name__}")

    @classmethod
    def from_timeline(cls, timeline: "TimelineData", *, skip_first: int = 0) -> "TaskCosts":
        """Costs measured in a traced run (``pipe.run(data, trace=True)``, then ``pipe.timeline``).

        Each task's ``seconds`` is the median time its function ran, ``samples`` its time in
        every iteration (iteration order); on an accelerator ``device`` and ``device_samples``
        come from the device timing events.

        Args:
            timeline: the run's Timeline.
            skip_first: leave out the first iterations (warm-up: first calls, caches).

        Raises:
            TypeError: ``timeline`` is not a Timeline.
            ValueError: ``skip_first`` is negative, or nothing is left to measure.
        """
        from ..observe.records import TimelineData

        if not isinstance(timeline, TimelineData):
            raise TypeError(f"from_timeline: expected a Timeline (pipe.timeline after run(data, trace=True)), got "
                            f"{type(timeline).__name__}")
        if isinstance(skip_first, bool) or not isinstance(skip_first, int) or skip_first < 0:
            raise ValueError(f"from_timeline: skip_first must be an int >= 0, got {skip_first!r}")
        costs: Dict[str, TaskCost] = {}
        for name in timeline.tasks:
            records = [r for r in timeline.for_task(name) if r.iteration >= skip_first]
            if not records:
                continue
            samples = tuple(r.duration for r in records)
            device = [r.device_end - r.device_start for r in records
                      if r.device_start is not None and r.device_end is not None]
            if len(device) == len(records):
                costs[name] = TaskCost(statistics.median(samples), statistics.median(device), samples,
                                       tuple(device))
            else:
                costs[name] = TaskCost(statistics.median(samples), samples=samples)
        if not costs:
            raise ValueError(f"from_timeline: no task ran at iteration >= {skip_first} in this timeline; "
                             f"lower skip_first or trace a longer run")
        return cls(costs)

    @classmethod
    def from_profile(cls, result: "ProfileResult") -> "TaskCosts":
        """Costs from ``TaskProfiler.profile``: each task's exposed time (what a serial iteration saves
        without it), for the tasks it measured."""
        from .profiler import ProfileResult

        if not isinstance(result, ProfileResult):
            raise TypeError(f"from_profile: expected a ProfileResult (TaskProfiler(pipe).profile(batch)), got "
                            f"{type(result).__name__}")
        return cls(dict(result.exposed_s))

    # -- changed copies ------------------------------------------------------------------------

    def replace(self, changes: Optional[Mapping[str, CostLike]] = None, **more: CostLike) -> "TaskCosts":
        """A copy with some tasks' costs replaced: ``costs.replace(Forward=0)`` or ``costs.replace({"H2D": 1e-3})``.

        A number replaces the task's thread time and drops its samples; it keeps the task's
        device time, except that 0 makes the task free on its stream too.

        Raises:
            ValueError: a name that is not one of these costs' tasks.
        """
        updates: Dict[str, CostLike] = dict(changes or {})
        updates.update(more)
        unknown = sorted(set(updates) - set(self._costs))
        if unknown:
            raise ValueError(f"replace: unknown task(s) {unknown}; the costs know {sorted(self._costs)}")
        out = dict(self._costs)
        for name, cost in updates.items():
            if isinstance(cost, TaskCost):
                out[name] = cost
            else:
                seconds = _seconds(f"replace({name}=...)", cost)
                device = self._costs[name].device
                if device is not None and seconds == 0:
                    device = 0.0
                out[name] = TaskCost(seconds, device)
        return TaskCosts(out)

    def scaled(self, factor: float) -> "TaskCosts":
        """Every cost (and sample) multiplied by ``factor`` (e.g. a faster machine)."""
        f = _seconds("scaled(factor)", factor)
        return TaskCosts({name: TaskCost(c.seconds * f, None if c.device is None else c.device * f,
                                         tuple(s * f for s in c.samples), tuple(s * f for s in c.device_samples))
                          for name, c in self._costs.items()})

    # -- reading -------------------------------------------------------------------------------

    def __getitem__(self, name: str) -> TaskCost:
        try:
            return self._costs[name]
        except KeyError:
            raise KeyError(f"no cost for task {name!r}; the costs know {sorted(self._costs)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._costs)

    def __len__(self) -> int:
        return len(self._costs)

    def seconds(self) -> Dict[str, float]:
        """Task name -> typical thread seconds, as a plain dict."""
        return {name: c.seconds for name, c in self._costs.items()}

    @property
    def has_device_times(self) -> bool:
        return any(c.device is not None for c in self._costs.values())

    @property
    def total(self) -> float:
        """The sum of the typical thread times: one serial iteration."""
        return sum(c.seconds for c in self._costs.values())

    def check_covers(self, names: Sequence[str], where: str) -> None:
        """Raise ValueError unless these costs name exactly the tasks ``names``."""
        missing = [n for n in names if n not in self._costs]
        unknown = sorted(set(self._costs) - set(names))
        if missing:
            raise ValueError(f"{where}: no cost for task(s) {missing}; give every task of the plan a cost "
                             f"(seconds, or 0 for a task that costs nothing)")
        if unknown:
            raise ValueError(f"{where}: cost(s) for task(s) {unknown} that the plan does not have (its tasks: "
                             f"{list(names)}); fix the names or drop those entries")

    def format(self) -> str:
        """The costs as a table: typical, p95 and spread per task (milliseconds)."""
        width = max([4] + [len(n) for n in self._costs])
        lines = [f"{'task':<{width}}  {'ms':>8}  {'p95 ms':>8}  {'spread':>6}  {'device ms':>9}",
                 f"{'-' * width}  {'-' * 8}  {'-' * 8}  {'-' * 6}  {'-' * 9}"]
        for name, c in self._costs.items():
            device = "-" if c.device is None else f"{c.device * 1e3:.3f}"
            lines.append(f"{name:<{width}}  {c.seconds * 1e3:>8.3f}  {c.p95 * 1e3:>8.3f}  {c.spread:>6.1%}  "
                         f"{device:>9}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        inner = ", ".join(f"{name!r}: {c.seconds:.6g}" for name, c in self._costs.items())
        return f"TaskCosts({{{inner}}})"
