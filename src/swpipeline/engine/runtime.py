"""What the engines know about each task: resolved once per pipeline (``TaskSpec``), bound once per run
(``BoundTask``, with that run's events and turns)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ..devices.device import Device
from ..plan.model import PipelinePlan, PipelineTask
from .signals import Turns

__all__: List[str] = []

DepRef = Tuple[int, Optional[List[Any]]]  # (dependency's task index, its events if this stream must wait on them)
BackRef = Tuple[int, Optional[List[Any]], int]  # ... and the distance: the dependency's iteration is i - distance


class TaskSpec:
    """What a pipeline resolves about one task once, at construction: placement, stream, dependencies.

    ``exec_fn`` is what a unit of the task launches: the task's function, or its shortcut
    executor, possibly wrapped by a race check (the pipeline's shortcut settings set it;
    changing it is refused while a run is in flight).
    """

    __slots__ = ("name", "index", "task", "stage", "group", "stream", "stream_label", "globally_ordered",
                 "shares_stream", "intra_deps", "inter_deps", "needs_events", "waits_at_retire", "waits_batch",
                 "consumers", "exec_fn")

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
        self.exec_fn: Callable[[Any], Any] = task.fn
        # (dependency index, whether it ran on another stream[, the distance: iteration i - distance])
        self.intra_deps: List[Tuple[int, bool]] = []
        self.inter_deps: List[Tuple[int, bool, int]] = []
        self.needs_events = False  # a consumer on another stream waits on it, or the caller does at retirement
        self.waits_at_retire = False  # a sink on a side stream: the caller's stream waits on it
        # no producer in its iteration: on a device with events, it waits for the batch to be ready on the
        # stream the caller drew it on (feed.Feed.draw), unless it runs on that stream
        self.waits_batch = False
        self.shares_stream = False  # its stream is used by several thread groups: units take turns on it
        self.consumers: Tuple[int, ...] = ()  # every task that depends on it, directly or not (lifetime.py)

    def __repr__(self) -> str:
        return f"<task {self.name} stage={self.stage} group={self.group} stream={self.stream_label}>"


class BoundTask:
    """One task bound to one run (``bind_run``): its spec, plus that run's device events, turns and streams.

    A run's units run bound tasks only, so an earlier run's straggler can never record or
    wait on a later run's events. The fields the unit executor reads are copied from the
    spec, so it reads them in one step.
    """

    __slots__ = ("spec", "name", "index", "stage", "group", "stream", "stream_label", "exec_fn", "waits_batch",
                 "waits_at_retire", "intra", "inter", "wait_intra", "wait_inter", "events", "turns", "stream_turns",
                 "keep_for", "plain")

    def __init__(self, spec: TaskSpec, stream: Any) -> None:
        self.spec = spec
        self.name, self.index, self.stage, self.group = spec.name, spec.index, spec.stage, spec.group
        self.stream = stream  # the run's: "default" is the filling thread's current stream
        self.stream_label = spec.stream_label
        self.exec_fn = spec.exec_fn  # as the pipeline's settings were when the run started
        self.waits_batch, self.waits_at_retire = spec.waits_batch, spec.waits_at_retire
        self.intra: List[DepRef] = []  # the dependencies, with the producers' events of this run
        self.inter: List[BackRef] = []  # ... and how many iterations back each is
        # what a unit must wait for: the dependencies above less those its own thread group's order meets
        self.wait_intra: List[DepRef] = []
        self.wait_inter: List[BackRef] = []
        self.events: Optional[List[Any]] = None
        self.turns: Optional[Turns] = None  # the run's sequencer, if globally ordered
        self.stream_turns: Optional[Turns] = None  # the run's turns on its stream, if it shares the stream
        self.keep_for: Tuple[Any, ...] = ()  # streams its context tensors are kept alive for (lifetime.py)
        self.plain = True  # no turns, no keep-alive, no event: a unit only launches

    def __repr__(self) -> str:
        return f"<task {self.name} bound to a run>"


def build_tasks(plan: PipelinePlan, device: Device) -> List[TaskSpec]:
    """Resolve every task's stream and dependencies once (events come per run, from ``bind_run``)."""
    tasks = []
    for index, task in enumerate(plan.tasks):
        sched = plan.schedules[task.name]
        tasks.append(TaskSpec(index, task, sched.stage, sched.thread_group, device.stream(sched.stream),
                                 device.stream_label(sched.stream), sched.globally_ordered))
    by_name = {t.name: t for t in tasks}
    consumed = {d for t in tasks for d in plan.intra[t.name]}
    default = device.default_stream()
    cross_stream = {d for t in tasks for d in plan.intra[t.name] + [d for d, _ in plan.inter[t.name]]
                    if by_name[d].stream != t.stream}
    groups_on: Dict[int, Set[str]] = {}
    for t in tasks:
        groups_on.setdefault(id(t.stream), set()).add(t.group)
    for t in tasks:
        t.shares_stream = len(groups_on[id(t.stream)]) > 1
        t.waits_at_retire = t.name not in consumed and t.stream != default
        t.needs_events = device.uses_events and (t.name in cross_stream or t.waits_at_retire)
        t.waits_batch = device.uses_events and not plan.intra[t.name]
        t.intra_deps = [(by_name[d].index, by_name[d].stream != t.stream) for d in plan.intra[t.name]]
        t.inter_deps = [(by_name[d].index, by_name[d].stream != t.stream, distance)
                        for d, distance in plan.inter[t.name]]
    for t, reach in zip(tasks, _consumers(plan)):
        t.consumers = tuple(by_name[name].index for name in reach)
    return tasks


def _consumers(plan: PipelinePlan) -> List[List[str]]:
    """Per task (in plan order), the tasks that depend on it directly or through others, in either iteration."""
    users: Dict[str, List[str]] = {name: [] for name in plan.task_names}
    for task in plan.task_names:
        for dep in plan.intra[task] + [d for d, _ in plan.inter[task]]:
            users[dep].append(task)
    found = []
    for name in plan.task_names:
        seen: Dict[str, None] = {}
        stack = list(users[name])
        while stack:
            user = stack.pop()
            if user not in seen:
                seen[user] = None
                stack.extend(users[user])
        found.append(list(seen))
    return found


def shared_streams(tasks: List[TaskSpec]) -> Dict[str, Dict[str, List[str]]]:
    """Stream label -> thread group -> its tasks on that stream, for each stream used by several groups
    (the tasks ``build_tasks`` marked ``shares_stream``)."""
    shared: Dict[str, Dict[str, List[str]]] = {}
    for t in tasks:
        if t.shares_stream:
            shared.setdefault(t.stream_label, {}).setdefault(t.group, []).append(t.name)
    return shared


def shared_stream_message(shared: Dict[str, Dict[str, List[str]]]) -> str:
    """The warning for a plan whose thread groups share streams (see ``shared_streams``)."""
    parts = []
    for label, groups in shared.items():
        users = " and ".join(f"thread group {g!r} ({', '.join(names)})" for g, names in groups.items())
        parts.append(f"stream {label!r} is used by {users}")
    return ("; ".join(parts) + ". Tasks on one stream take turns, so these thread groups' tasks never overlap "
            "each other (on the CPU a stream is an execution lane; on a GPU their kernels would queue on one "
            "stream anyway). To let them overlap, give each thread group's tasks their own stream "
            "(TaskSchedule(stream=...)); if the turns are intended, silence this with "
            "warnings.simplefilter('ignore', swpipeline.SharedStreamWarning).")


def bind_run(tasks: List[TaskSpec], device: Device, event_slots: int, default: Any) -> List[BoundTask]:
    """``tasks`` bound to one run: each producer with ``event_slots`` fresh device events, and the run's own
    turns (one sequencer for the globally ordered tasks, one per stream shared by thread groups).

    ``default`` is the run's default stream (the one current on the thread that filled
    it): tasks on the device's default stream run on it. On a device that tracks memory,
    each task learns the streams its context tensors are kept alive for (``keep_for``).

    With ``event_slots = live + reach`` (``live``: the most iterations alive at once;
    ``reach``: the furthest distance of an inter-iteration dependency) a slot is reused by
    iteration ``i + live + reach`` at the earliest, which enters only after iteration
    ``i + reach`` (the last possible consumer of ``i``) has retired.
    """
    device_default = device.default_stream()
    bound = [BoundTask(t, default if t.stream is device_default else t.stream) for t in tasks]
    if device.tracks_memory:
        for b in bound:
            streams = [bound[c].stream for c in b.spec.consumers] + ([default] if b.waits_at_retire else [])
            b.keep_for = tuple({id(s): s for s in streams if s is not b.stream}.values())
    sequencer = Turns("the sequencer")
    on_stream: Dict[int, Turns] = {}
    for b in bound:
        spec = b.spec
        b.events = [device.new_event() for _ in range(event_slots)] if spec.needs_events else None
        b.turns = sequencer if spec.globally_ordered else None
        if spec.shares_stream:
            b.stream_turns = on_stream.setdefault(id(b.stream), Turns(f"stream {b.stream_label!r}"))
    for b in bound:
        b.intra = [(d, bound[d].events if cross else None) for d, cross in b.spec.intra_deps]
        b.inter = [(d, bound[d].events if cross else None, distance) for d, cross, distance in b.spec.inter_deps]
        # A producer in the consumer's own thread group has run by the time the consumer does: both engines run
        # a group's units on one thread in one order, the schedule's, which puts every producer unit before its
        # consumers (paper.check proves it for each plan). Only its device event, if any, is left to wait on.
        b.wait_intra = [(d, events) for d, events in b.intra if events is not None or bound[d].group != b.group]
        b.wait_inter = [(d, events, distance) for d, events, distance in b.inter
                        if events is not None or bound[d].group != b.group]
        b.plain = b.turns is None and b.stream_turns is None and not b.keep_for and b.events is None
    return bound


def all_turns(tasks: List[BoundTask]) -> List[Turns]:
    """Every ``Turns`` of a run's tasks, once each."""
    found: Dict[int, Turns] = {}
    for t in tasks:
        for turns in (t.turns, t.stream_turns):
            if turns is not None:
                found[id(turns)] = turns
    return list(found.values())


def run_default_stream(device: Device, tasks: List[TaskSpec]) -> Any:
    """The stream current on the filling thread, which a run's "default" tasks use.

    Raises:
        ValueError: the plan names that stream for some tasks (they would share it with the
            default tasks without taking turns).
    """
    stream = device.caller_stream()
    if stream is not device.default_stream():
        on_it = [t for t in tasks if t.stream is stream]
        if on_it:
            raise ValueError(
                f"fill_pipeline(): the stream current on this thread ({on_it[0].stream_label!r}) is also the stream "
                f"of task(s) {[t.name for t in on_it]}; the plan's \"default\" tasks would run on it beside them. "
                f"Fill the pipeline outside that stream's context, or give those tasks another stream")
    return stream
