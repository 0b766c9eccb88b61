"""What the engines know about each task at run time, resolved once at construction."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

from .device import Device
from .plan import PipelinePlan, PipelineTask

__all__: List[str] = []


class TaskRuntime:
    """What the engine knows about one task at run time (resolved once at construction)."""

    __slots__ = ("name", "index", "task", "stage", "group", "stream", "stream_label", "globally_ordered",
                 "intra", "inter", "events", "waits_at_retire", "exec_fn")

    def __init__(self, index: int, task: PipelineTask, stage: int, group: str, stream: Any,
                 stream_label: str, globally_ordered: bool) -> None:
        self.name = task.name
        self.index = index
        self.task = task
        self.stage = stage
        self.group = group
        self.stream = stream
        self.stream_label = stream_label
        self.globally_ordered = globally_ordered
        self.exec_fn: Callable[[Any], Any] = task.fn  # task.fn, or its shortcut executor
        # (dependency index, its events if this task's stream must wait on them, else None)
        self.intra: List[Tuple[int, Optional[List[Any]]]] = []
        self.inter: List[Tuple[int, Optional[List[Any]]]] = []
        self.events: Optional[List[Any]] = None  # one device event per slot, if anyone waits on it
        self.waits_at_retire = False  # a sink on a side stream: the caller's stream waits on it

    def __repr__(self) -> str:
        return f"<task {self.name} stage={self.stage} group={self.group} stream={self.stream_label}>"


def build_tasks(plan: PipelinePlan, device: Device, event_slots: int) -> List[TaskRuntime]:
    """Resolve every task's stream, dependencies and device events once.

    ``event_slots`` events are allocated per task that some consumer on another
    stream waits on (or that is a sink on a side stream, waited on at retirement).
    """
    tasks = []
    for index, task in enumerate(plan.tasks):
        sched = plan.schedules[task.name]
        tasks.append(TaskRuntime(index, task, sched.stage, sched.thread_group, device.stream(sched.stream),
                                 device.stream_label(sched.stream), sched.globally_ordered))
    by_name = {t.name: t for t in tasks}
    consumed = {d for t in tasks for d in plan.intra[t.name]}
    default = device.default_stream()
    cross_stream = {d for t in tasks for d in plan.intra[t.name] + plan.inter[t.name]
                    if by_name[d].stream != t.stream}
    for t in tasks:
        t.waits_at_retire = t.name not in consumed and t.stream != default
        if device.uses_events and (t.name in cross_stream or t.waits_at_retire):
            # With event_slots = depth + 1, a slot is reused by iteration i + depth + 1 at the earliest,
            # which is only enqueued after iteration i + 1 (the last possible consumer of i) has retired.
            t.events = [device.new_event() for _ in range(event_slots)]

    def resolve(t: TaskRuntime, deps: List[str]) -> List[Tuple[int, Optional[List[Any]]]]:
        return [(by_name[d].index, by_name[d].events if by_name[d].stream != t.stream else None)
                for d in deps]

    for t in tasks:
        t.intra = resolve(t, plan.intra[t.name])
        t.inter = resolve(t, plan.inter[t.name])
    return tasks
