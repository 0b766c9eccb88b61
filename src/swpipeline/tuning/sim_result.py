"""``SimResult``: what a simulated run predicts, and ``SimUnit``, one simulated task execution."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .sim_path import PathStep, path_shares

if TYPE_CHECKING:
    from ..observe.records import DependencyWait
    from ..observe.timeline import Timeline

__all__: List[str] = []


@dataclass(frozen=True)
class SimUnit:
    """One simulated task execution (seconds since the start of ``run()``).

    ``picked`` is when its thread took it up (before its dependency waits); ``period`` is
    the clock period (the virtual one for the data-flow engine, None for ``serial``);
    ``device_start``/``device_end`` its work on its stream, for tasks with a device time.
    """

    task: str
    iteration: int
    thread_group: str
    stream: str
    stage: int
    period: Optional[int]
    picked: float
    start: float
    end: float
    device_start: Optional[float] = None
    device_end: Optional[float] = None


@dataclass(frozen=True)
class SimArrays:
    """The raw per-unit times of a simulated run (``key = iteration * len(tasks) + task``)."""

    tasks: Tuple[str, ...]
    stages: Tuple[int, ...]
    groups: Tuple[str, ...]  # per task
    streams: Tuple[str, ...]  # per task
    picked: Sequence[float]
    start: Sequence[float]
    end: Sequence[float]
    device_start: Sequence[float] = ()
    device_end: Sequence[float] = ()
    device_tasks: Tuple[bool, ...] = ()  # per task: has a device time
    intra: Tuple[Tuple[int, ...], ...] = ()  # per task: its intra-iteration dependencies (task indices)
    inter: Tuple[Tuple[Tuple[int, int], ...], ...] = ()  # ... and its inter-iteration ones: (task, distance)


@dataclass(frozen=True)
class SimResult:
    """A simulated run's prediction (see ``simulate``).

    Attributes:
        engine: ``"clocked"``, ``"dataflow"`` or ``"serial"``.
        num_iterations: iterations simulated.
        depth: the plan's depth (``max(stage) + 1``).
        max_depth: the most iterations alive (the depth for ``clocked``, 1 for ``serial``).
        seconds: the predicted wall time of ``run()`` over ``num_iterations`` batches:
            starting the threads, filling, draining, stopping (and, on an accelerator,
            the device finishing).
        steady_seconds_per_iteration: the time between two retired iterations once the
            pipeline is full (fill and drain left out).
        thread_busy: thread group -> share of ``seconds`` its thread ran task functions.
        stream_busy: stream -> share of ``seconds`` work ran on it (device time where
            the costs have one).
        peak_live_contexts, mean_live_contexts: iterations alive at once (batches and
            contexts held): the most, and the time-weighted mean.
        retire_times: when each iteration retired.
    """

    engine: str
    num_iterations: int
    depth: int
    max_depth: int
    seconds: float
    steady_seconds_per_iteration: float
    thread_busy: Mapping[str, float]
    stream_busy: Mapping[str, float]
    peak_live_contexts: int
    mean_live_contexts: float
    retire_times: Tuple[float, ...]
    arrays: SimArrays = field(repr=False, compare=False)
    path_source: Callable[[], Tuple[PathStep, ...]] = field(repr=False, compare=False, default=tuple)

    @functools.cached_property
    def critical_path(self) -> Tuple[PathStep, ...]:
        """The chain of waits that decided when the run ended, from time 0 to the end (see ``PathStep``)."""
        return self.path_source()

    @functools.cached_property
    def critical_share(self) -> Mapping[str, float]:
        """Seconds on the critical path per task, plus ``(hand-offs)`` (wake-ups and the engine's per-unit
        cost) and ``(caller)`` (the thread that drives the pipeline), largest first."""
        return MappingProxyType(path_shares(self.critical_path))

    @property
    def seconds_per_iteration(self) -> float:
        """``seconds / num_iterations``: the whole run, fill and drain included, per iteration."""
        return self.seconds / self.num_iterations

    @property
    def throughput(self) -> float:
        """Iterations per second over the whole run."""
        return self.num_iterations / self.seconds if self.seconds > 0 else float("inf")

    @property
    def thread_bubbles(self) -> Mapping[str, float]:
        """Thread group -> share of ``seconds`` its thread ran no task (``1 - thread_busy``)."""
        return MappingProxyType({g: max(0.0, 1.0 - b) for g, b in self.thread_busy.items()})

    @property
    def stream_bubbles(self) -> Mapping[str, float]:
        """Stream -> share of ``seconds`` nothing ran on it."""
        return MappingProxyType({s: max(0.0, 1.0 - b) for s, b in self.stream_busy.items()})

    @property
    def bottleneck(self) -> str:
        """The task with the most time on the critical path (or ``(hand-offs)``/``(caller)``)."""
        return next(iter(self.critical_share)) if self.critical_share else ""

    def units(self) -> List[SimUnit]:
        """Every simulated task execution, ordered by start (then task order)."""
        a, n = self.arrays, len(self.arrays.tasks)
        out = []
        for key in range(len(a.start)):
            task, it = key % n, key // n
            dev = a.device_tasks[task] if a.device_tasks else False
            period = None if self.engine == "serial" else it + a.stages[task]
            out.append(SimUnit(a.tasks[task], it, a.groups[task], a.streams[task], a.stages[task], period,
                               a.picked[key], a.start[key], a.end[key],
                               a.device_start[key] if dev else None, a.device_end[key] if dev else None))
        out.sort(key=lambda u: (u.start, u.end, a.tasks.index(u.task)))
        return out

    def timeline(self) -> "Timeline":
        """The simulated run as a ``Timeline``, to draw (``save_chart``) or open in Perfetto like a traced run.

        Each record lists, as a traced run does, the dependencies its unit had to wait for.
        """
        from ..observe.records import TaskRecord
        from ..observe.timeline import Timeline

        records = tuple(TaskRecord(task=u.task, iteration=u.iteration, thread_group=u.thread_group, stream=u.stream,
                                   stage=u.stage, period=u.period if self.engine == "clocked" else None,
                                   ready=u.picked, cpu_start=u.start, cpu_end=u.end, waits=self._waits(u),
                                   device_start=u.device_start, device_end=u.device_end) for u in self.units())
        a = self.arrays
        return Timeline(engine=f"simulated {self.engine}", device="simulated", origin=0.0, wall=self.seconds,
                        records=records, tasks=a.tasks, thread_groups=tuple(dict.fromkeys(a.groups)),
                        streams=tuple(dict.fromkeys(a.streams)))

    def _waits(self, unit: SimUnit) -> Tuple["DependencyWait", ...]:
        """The dependencies still running when ``unit`` was picked up, as a traced run records them."""
        from ..observe.records import DependencyWait

        a, n = self.arrays, len(self.arrays.tasks)
        task, it = a.tasks.index(unit.task), unit.iteration
        waits = []
        deps = [(d, it) for d in (a.intra[task] if a.intra else ())]
        deps += [(d, it - back) for d, back in (a.inter[task] if a.inter else ()) if it >= back]
        for dep, dep_it in deps:
            end = a.end[dep_it * n + dep]
            if end > unit.picked:
                waits.append(DependencyWait(a.tasks[dep], dep_it, unit.picked, min(end, unit.start)))
        return tuple(waits)

    def format(self) -> str:
        """The prediction as text: the headline, live contexts, busy and bubbles per lane, the critical path."""
        ms = self.seconds_per_iteration * 1e3
        lines = [f"simulated {self.engine} engine (depth {self.depth}, at most {self.max_depth} iterations alive), "
                 f"{self.num_iterations} iterations: {self.seconds:.4f} s, {ms:.3f} ms/iteration, "
                 f"{self.throughput:.1f} iterations/s (steady state {self.steady_seconds_per_iteration * 1e3:.3f} "
                 f"ms/iteration)",
                 f"live contexts: peak {self.peak_live_contexts}, mean {self.mean_live_contexts:.2f}", ""]
        lanes = [(f"thread {g}", b) for g, b in self.thread_busy.items()]
        lanes += [(f"stream {s}", b) for s, b in self.stream_busy.items()]
        width = max(len(name) for name, _ in lanes)
        lines += [f"{'lane':<{width}}  {'busy':>6}  {'bubbles':>7}", f"{'-' * width}  {'-' * 6}  {'-' * 7}"]
        lines += [f"{name:<{width}}  {b:>6.1%}  {max(0.0, 1 - b):>7.1%}" for name, b in lanes]
        lines += ["", "critical path (share of the run): " + ", ".join(
            f"{name} {seconds / self.seconds:.1%}" for name, seconds in list(self.critical_share.items())[:6]
            if self.seconds > 0 and seconds > 0)]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def live_contexts(created: Sequence[float], retired: Sequence[float], total: float) -> Tuple[int, float]:
    """The most iterations alive at once, and the time-weighted mean over ``total`` seconds."""
    events = sorted([(t, 1) for t in created] + [(t, -1) for t in retired], key=lambda e: (e[0], e[1]))
    alive = peak = 0
    area, last = 0.0, 0.0
    for t, delta in events:
        area += alive * (t - last)
        last, alive = t, alive + delta
        peak = max(peak, alive)
    return peak, (area / total if total > 0 else 0.0)


def busy_shares(arrays: SimArrays, total: float) -> Tuple[Dict[str, float], Dict[str, float]]:
    """Share of ``total`` each thread group ran tasks, and each stream ran work (device spans where recorded)."""
    n = len(arrays.tasks)
    thread: Dict[str, float] = {g: 0.0 for g in dict.fromkeys(arrays.groups)}
    stream: Dict[str, float] = {s: 0.0 for s in dict.fromkeys(arrays.streams)}
    device_mode = bool(arrays.device_tasks) and any(arrays.device_tasks)
    for key in range(len(arrays.start)):
        task = key % n
        span = arrays.end[key] - arrays.start[key]
        thread[arrays.groups[task]] += span
        if not device_mode:
            stream[arrays.streams[task]] += span
        elif arrays.device_tasks[task]:
            stream[arrays.streams[task]] += arrays.device_end[key] - arrays.device_start[key]
    if total <= 0:
        return {g: 0.0 for g in thread}, {s: 0.0 for s in stream}
    return {g: v / total for g, v in thread.items()}, {s: v / total for s, v in stream.items()}
