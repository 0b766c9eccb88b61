"""Reading back a trace written by ``run(trace="run.json")``: its timeline, and the plan that ran.

The trace (see ``trace_export``) holds, per unit, the task span on its thread with the
iteration, stage, thread group and stream in ``args``, the dependency waits, and on an
accelerator the device span. That gives back the ``Timeline`` (so ``TaskCosts.from_timeline``
works on a file) and each task's schedule.

Dependencies are only partly visible in a trace: a dependency shows as a wait only if
its consumer ever had to wait for it, and two tasks on one thread never wait for each
other. When the trace does not carry the plan's dependencies (``otherData["plan"]``),
``plan_from_timeline`` rebuilds a conservative set: every observed wait, plus, per thread
group, each task after the group's tasks that ran before it in an iteration, and after
all of the group's tasks of the previous iteration (where the stage rules allow), so a
plan built from them keeps what ran on each thread in order.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from ..plan.model import InterDependency, PipelinePlan, TaskSchedule
from ..observe.records import DependencyWait, TaskRecord
from ..observe.timeline import Timeline
from ..observe.trace_export import STREAMS_PID, THREADS_PID

__all__: List[str] = []

Pair = Tuple[str, str]


FROM_RUN = "pass a trace written by pipe.run(data, trace='run.json')"


class TraceError(ValueError):
    """A file that is not a trace ``swpipeline plan`` can read; the message names the file and what is missing."""


def read_trace(path: "os.PathLike[str] | str") -> Tuple[Timeline, Dict[str, Any]]:
    """The Timeline stored in a Chrome trace file written by ``run(trace=path)``, and its ``otherData``.

    Events of other tools (other processes or categories) are skipped; this library's task spans,
    dependency waits and device spans must carry the fields it writes.

    Raises:
        OSError: the file cannot be read.
        TraceError: it is not such a trace (not JSON text, no task spans, an event without a field
            it needs, a wait for a task that never ran); the message names the file and the event.
    """
    name = os.fspath(path)
    data = _load(name)
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise TraceError(f"{name}: has no traceEvents list; {FROM_RUN}")
    spans: Dict[Tuple[str, int], Dict[str, Any]] = {}
    waits: Dict[Tuple[str, int], List[DependencyWait]] = {}
    waited_for: List[Tuple[int, str, int, str]] = []  # (event index, task, iteration, dependency)
    device: Dict[Tuple[str, int], Tuple[float, float]] = {}
    for index, ev in enumerate(events):
        kind = _kind(ev)
        if kind is None:
            continue
        event = _Event(name, index, kind, ev)
        start, end = event.span()
        if kind == "task span":
            key = (event.name(), event.integer("iteration"))
            spans[key] = {"start": start, "end": end, "stage": event.integer("stage"),
                          "thread_group": event.text("thread_group"), "stream": event.text("stream"),
                          "period": event.integer("period", optional=True)}
        elif kind == "dependency wait":
            task, iteration = event.text("task"), event.integer("iteration")
            dependency, dependency_iteration = event.text("dependency"), event.integer("dependency_iteration")
            waits.setdefault((task, iteration), []).append(DependencyWait(dependency, dependency_iteration,
                                                                          start, end))
            waited_for.append((index, task, iteration, dependency))
        else:
            device[(event.name(), event.integer("iteration"))] = (start, end)
    if not spans:
        raise TraceError(f"{name}: holds no task spans (events of category 'task' on process {THREADS_PID}); "
                         f"{FROM_RUN}, of a run that completed at least one task")
    traced = {task for task, _ in spans}
    for index, task, iteration, dependency in waited_for:
        if dependency not in traced:
            raise TraceError(f"{name}: traceEvents[{index}], a dependency wait of {task}(i{iteration}), waits for "
                             f"{dependency!r}, which has no task span in the trace; {FROM_RUN}")
    records = []
    for (task, it), a in spans.items():
        dev = device.get((task, it))
        records.append(TaskRecord(task=task, iteration=it, thread_group=a["thread_group"], stream=a["stream"],
                                  stage=a["stage"], period=a["period"], ready=a["start"], cpu_start=a["start"],
                                  cpu_end=a["end"], waits=tuple(waits.get((task, it), ())),
                                  device_start=dev[0] if dev else None, device_end=dev[1] if dev else None))
    records.sort(key=lambda r: (r.cpu_start, r.cpu_end))
    other = data.get("otherData", {}) if isinstance(data.get("otherData"), dict) else {}
    wall_ms = other.get("wall_ms", 0.0)
    if isinstance(wall_ms, bool) or not isinstance(wall_ms, (int, float)) or not math.isfinite(wall_ms):
        raise TraceError(f"{name}: otherData.wall_ms is {wall_ms!r}, not a number of milliseconds; {FROM_RUN}")
    first: Dict[str, Tuple[int, float]] = {}
    for r in sorted(records, key=lambda r: (r.iteration, r.cpu_start)):
        first.setdefault(r.task, (r.iteration, r.cpu_start))
    tasks = tuple(sorted(first, key=lambda t: first[t]))
    wall = max(float(wall_ms) / 1e3, max(r.cpu_end for r in records))
    timeline = Timeline(engine=str(other.get("engine", "SWPipeline")), device=str(other.get("device", "cpu")),
                        origin=0.0, wall=wall, records=tuple(records), tasks=tasks,
                        thread_groups=tuple(dict.fromkeys(r.thread_group for r in records)),
                        streams=tuple(dict.fromkeys(r.stream for r in records)))
    return timeline, other


def _load(name: str) -> Any:
    """The file's JSON value (TraceError: not UTF-8 text, not JSON, or nested too deeply to read)."""
    with open(name, "rb") as handle:
        raw = handle.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        what = "a PNG picture" if raw.startswith(b"\x89PNG") else "binary data"
        raise TraceError(f"{name}: is {what}, not a JSON trace; {FROM_RUN}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{name}: is not a JSON trace ({exc}); {FROM_RUN}") from None
    except RecursionError:
        raise TraceError(f"{name}: its JSON is nested too deeply to read (a trace's events are flat); "
                         f"{FROM_RUN}") from None


def _kind(ev: Any) -> Optional[str]:
    """Which of this library's events ``ev`` is (None: another tool's event, skipped)."""
    if not isinstance(ev, dict) or ev.get("ph") != "X":
        return None
    pid, cat = ev.get("pid"), ev.get("cat")
    if pid == THREADS_PID and cat == "task":
        return "task span"
    if pid == THREADS_PID and cat == "dependency_wait":
        return "dependency wait"
    if pid == STREAMS_PID and cat == "device":
        return "device span"
    return None


class _Event:
    """One of this library's events, read field by field: TraceError naming the file, event and field."""

    def __init__(self, file: str, index: int, kind: str, ev: Dict[str, Any]) -> None:
        self.file, self.index, self.kind, self.ev = file, index, kind, ev
        args = ev.get("args")
        self.args: Dict[str, Any] = args if isinstance(args, dict) else {}

    def _where(self) -> str:
        name = self.ev.get("name")
        return f"{self.file}: traceEvents[{self.index}], a {self.kind}" + (f" {name!r}" if isinstance(name, str)
                                                                          else "")

    def _refuse(self, problem: str) -> TraceError:
        return TraceError(f"{self._where()}, {problem}; {FROM_RUN}")

    def span(self) -> Tuple[float, float]:
        """(start, end) in seconds from ``ts`` and ``dur`` (microseconds)."""
        values = []
        for key in ("ts", "dur"):
            value = self.ev.get(key)
            if value is None:
                raise self._refuse(f"has no {key!r}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise self._refuse(f"has {key} {value!r}, not a number of microseconds")
            values.append(float(value))
        if values[1] < 0:
            raise self._refuse(f"has a negative dur {values[1]!r}")
        return values[0] / 1e6, (values[0] + values[1]) / 1e6

    def name(self) -> str:
        value = self.ev.get("name")
        if not isinstance(value, str) or not value:
            raise self._refuse("has no task name")
        return value

    def integer(self, key: str, optional: bool = False) -> Any:
        value = self.args.get(key)
        if value is None and optional:
            return None
        if value is None:
            raise self._refuse(f"has no args.{key}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self._refuse(f"has args.{key} {value!r}, not a whole number >= 0")
        return value

    def text(self, key: str) -> str:
        value = self.args.get(key)
        if value is None:
            raise self._refuse(f"has no args.{key}")
        if not isinstance(value, str) or not value:
            raise self._refuse(f"has args.{key} {value!r}, not a name")
        return value


def declared_plan(other: Dict[str, Any], tasks: Sequence[str], file: str) -> Optional[Dict[str, Any]]:
    """The trace's ``otherData["plan"]`` checked against its tasks (None if the trace has none).

    Raises:
        TraceError: it is not ``{"intra": [[task, dep], ...], "inter": [...], "globally_ordered": [...]}`` of
            traced tasks.
    """
    plan = other.get("plan")
    if plan is None:
        return None
    where = f"{file}: otherData.plan"
    if not isinstance(plan, dict):
        raise TraceError(f"{where} is not an object of dependencies; {FROM_RUN}")
    known = set(tasks)
    for key in ("intra", "inter", "globally_ordered"):
        entries = plan.get(key, [])
        if not isinstance(entries, list):
            raise TraceError(f"{where}.{key} is not a list; {FROM_RUN}")
        for entry in entries:
            names = entry if key != "globally_ordered" else [entry]
            if isinstance(names, list) and key == "inter" and len(names) == 3 and \
                    isinstance(names[2], int) and not isinstance(names[2], bool) and names[2] >= 1:
                names = names[:2]  # [task, depends_on, distance]
            if not isinstance(names, list) or len(names) != (1 if key == "globally_ordered" else 2) or \
                    not all(isinstance(n, str) for n in names):
                shape = "a task name" if key == "globally_ordered" else "a [task, depends_on] pair of task names"
                if key == "inter":
                    shape += " (or a [task, depends_on, distance] triple)"
                raise TraceError(f"{where}.{key} holds {entry!r}, not {shape}; {FROM_RUN}")
            unknown = [n for n in names if n not in known]
            if unknown:
                raise TraceError(f"{where}.{key} names {unknown[0]!r}, which has no task span in the trace; "
                                 f"{FROM_RUN}")
    return plan


def plan_from_timeline(timeline: Timeline, declared: Optional[Dict[str, Any]] = None) -> Tuple[PipelinePlan, bool]:
    """The plan that ran (schedules from the records) and whether its dependencies were declared in the trace.

    ``declared`` is the trace's ``otherData["plan"]`` (``{"intra": [[task, dep], ...], "inter": [...],
    "globally_ordered": [...]}``) when present; otherwise the dependencies are rebuilt as the module
    docstring says.
    """
    first: Dict[str, TaskRecord] = {}
    for r in timeline.records:
        first.setdefault(r.task, r)
    ordered = set(declared.get("globally_ordered", ())) if declared else set()
    schedule = {name: TaskSchedule(stage=first[name].stage, thread_group=first[name].thread_group,
                                   stream=None if first[name].stream == "default" else first[name].stream,
                                   globally_ordered=name in ordered) for name in timeline.tasks}
    if declared and "intra" in declared:
        intra = [(str(t), str(d)) for t, d in declared.get("intra", ())]
        inter: List[InterDependency] = [(str(e[0]), str(e[1]), int(e[2])) if len(e) == 3 else (str(e[0]), str(e[1]))
                                       for e in declared.get("inter", ())]
        return PipelinePlan(schedule, intra, inter), True
    intra_set, inter_set = _observed(timeline)
    stage = {name: s.stage for name, s in schedule.items()}
    for group in timeline.thread_groups:  # what ran on one thread stays in that order, where the rules allow
        members = [n for n in timeline.tasks if schedule[n].thread_group == group]
        for k, later in enumerate(members):
            for earlier in members[:k]:
                if stage[earlier] <= stage[later]:
                    intra_set.add((later, earlier))
            for other in members:  # and after the thread's tasks of the previous iteration
                if stage[other] <= stage[later] + 1:
                    inter_set.add((later, other))
    intra = _acyclic(sorted(intra_set, key=lambda p: (timeline.tasks.index(p[0]), timeline.tasks.index(p[1]))),
                     timeline.tasks)
    return PipelinePlan(schedule, intra, sorted(inter_set)), False


def _observed(timeline: Timeline) -> Tuple[Set[Pair], Set[Pair]]:
    """The (task, dependency) pairs seen waited on: same iteration (intra) or the one before (inter)."""
    intra: Set[Pair] = set()
    inter: Set[Pair] = set()
    stage = {r.task: r.stage for r in timeline.records}
    for r in timeline.records:
        for w in r.waits:
            if w.iteration == r.iteration and w.task != r.task and stage[w.task] <= stage[r.task]:
                intra.add((r.task, w.task))
            elif w.iteration == r.iteration - 1 and stage[w.task] <= stage[r.task] + 1:
                inter.add((r.task, w.task))
    return intra, inter


def _acyclic(pairs: List[Pair], order: Tuple[str, ...]) -> List[Pair]:
    """The pairs whose dependency ran before its task in ``order`` (the serial order): never a cycle."""
    position = {name: k for k, name in enumerate(order)}
    return [(t, d) for t, d in pairs if position[d] < position[t]]
