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
import os
from typing import Any, Dict, List, Optional, Set, Tuple

from ..plan import PipelinePlan, TaskSchedule
from ..records import DependencyWait, TaskRecord
from ..timeline import Timeline
from ..trace_export import STREAMS_PID, THREADS_PID

__all__: List[str] = []

Pair = Tuple[str, str]


def read_trace(path: "os.PathLike[str] | str") -> Tuple[Timeline, Dict[str, Any]]:
    """The Timeline stored in a Chrome trace file written by ``run(trace=path)``, and its ``otherData``.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not such a trace (not JSON, or no task spans).
    """
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{os.fspath(path)!r} is not a JSON trace ({exc}); pass a file written by "
                         f"pipe.run(data, trace='run.json')") from None
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise ValueError(f"{os.fspath(path)!r} has no traceEvents list; pass a file written by "
                         f"pipe.run(data, trace='run.json')")
    spans: Dict[Tuple[str, int], Dict[str, Any]] = {}
    waits: Dict[Tuple[str, int], List[DependencyWait]] = {}
    device: Dict[Tuple[str, int], Tuple[float, float]] = {}
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        args, start = ev.get("args", {}), ev["ts"] / 1e6
        end = start + ev["dur"] / 1e6
        if ev.get("pid") == THREADS_PID and ev.get("cat") == "task":
            spans[(ev["name"], args["iteration"])] = dict(args, start=start, end=end)
        elif ev.get("pid") == THREADS_PID and ev.get("cat") == "dependency_wait":
            waits.setdefault((args["task"], args["iteration"]), []).append(
                DependencyWait(args["dependency"], args["dependency_iteration"], start, end))
        elif ev.get("pid") == STREAMS_PID and ev.get("cat") == "device":
            device[(ev["name"], args["iteration"])] = (start, end)
    if not spans:
        raise ValueError(f"{os.fspath(path)!r} holds no task spans; pass a trace of a run that completed "
                         f"at least one task")
    records = []
    for (task, it), a in spans.items():
        dev = device.get((task, it))
        records.append(TaskRecord(task=task, iteration=it, thread_group=a["thread_group"], stream=a["stream"],
                                  stage=a["stage"], period=a.get("period"), ready=a["start"], cpu_start=a["start"],
                                  cpu_end=a["end"], waits=tuple(waits.get((task, it), ())),
                                  device_start=dev[0] if dev else None, device_end=dev[1] if dev else None))
    records.sort(key=lambda r: (r.cpu_start, r.cpu_end))
    other = data.get("otherData", {}) if isinstance(data.get("otherData"), dict) else {}
    first: Dict[str, Tuple[int, float]] = {}
    for r in sorted(records, key=lambda r: (r.iteration, r.cpu_start)):
        first.setdefault(r.task, (r.iteration, r.cpu_start))
    tasks = tuple(sorted(first, key=lambda t: first[t]))
    wall = max(float(other.get("wall_ms", 0.0)) / 1e3, max(r.cpu_end for r in records))
    timeline = Timeline(engine=str(other.get("engine", "SWPipeline")), device=str(other.get("device", "cpu")),
                        origin=0.0, wall=wall, records=tuple(records), tasks=tasks,
                        thread_groups=tuple(dict.fromkeys(r.thread_group for r in records)),
                        streams=tuple(dict.fromkeys(r.stream for r in records)))
    return timeline, other


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
        inter = [(str(t), str(d)) for t, d in declared.get("inter", ())]
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
