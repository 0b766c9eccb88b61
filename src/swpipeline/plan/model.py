"""The plan model: what a pipeline runs (tasks) and how (schedule and dependencies).

A :class:`PipelinePlan` is a value. Building one checks everything that does not
depend on the engine: types, names, references, self-dependencies and cycles among
the intra-iteration dependencies. The two stage rules (an intra-iteration
dependency sits at its task's stage or an earlier one; an inter-iteration dependency
at distance ``d`` at most ``d`` stages later) are engine rules, checked when an engine is built (see
``ordering.validate_stages``).

Guarantees this module gives to the rest of the package:

* ``PipelinePlan.tasks`` lists every task once, in declaration order, and every
  dependency in ``intra``/``inter`` names one of them; ``inter`` holds ``(name, distance)``
  pairs, each distance an int >= 1, one per dependency (the smallest declared);
* the intra-iteration dependency graph is acyclic;
* ``TaskSchedule`` fields have the right types, and every scheduled stage is >= 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from .context import IterContext

__all__: List[str] = []

StreamSpec = Any  # None (default stream), a name (str), or a torch stream object


@dataclass(frozen=True)
class DeclaredIO:
    """A task's read/write contract with state outside the IterContext.

    ``capture()`` is called after the task runs while its result is being cached;
    ``restore(value)`` is called instead of the task when it is shortcut.
    """

    capture: Callable[[], Any]
    restore: Callable[[Any], None]

    def __post_init__(self) -> None:
        if not callable(self.capture) or not callable(self.restore):
            raise TypeError("DeclaredIO: capture and restore must both be callables")


@dataclass(eq=False)
class PipelineTask:
    """One schedulable unit of work: a name, a function of the IterContext, its side effects.

    Tasks hash by name, so they can key ``PipelinePlan.schedule``, and compare equal
    when they have the same name and run the same function with the same io: the same
    task declared twice is one key. Two *different* tasks with one name are never equal,
    so a dict keeps both of them and ``PipelinePlan`` refuses the duplicate name (had
    they compared equal, the dict would silently keep one task with the other's
    schedule). Comparing tasks changes nothing about them.
    """

    name: str
    fn: Callable[[IterContext], Any]
    io: List[DeclaredIO] = field(default_factory=list)
    reads: Optional[FrozenSet[str]] = None  # the context attributes it reads, if declared (see free_early)
    writes: Optional[FrozenSet[str]] = None  # ... and those it assigns, modifies or deletes

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"PipelineTask: name must be a non-empty str, got {self.name!r}")
        if not callable(self.fn):
            raise TypeError(f"PipelineTask {self.name!r}: fn must be callable, got {type(self.fn).__name__}")
        self.io = list(self.io)
        for item in self.io:
            if not isinstance(item, DeclaredIO):
                raise TypeError(
                    f"PipelineTask {self.name!r}: io entries must be DeclaredIO, got {type(item).__name__}"
                )
        self.reads = _attribute_names(self.name, "reads", self.reads)
        self.writes = _attribute_names(self.name, "writes", self.writes)

    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PipelineTask):
            return other is self or (self.name == other.name and self.fn is other.fn and self.io == other.io)
        return NotImplemented

    def __repr__(self) -> str:
        return f"PipelineTask({self.name!r})"


def _attribute_names(task: str, what: str, names: Any) -> Optional[FrozenSet[str]]:
    """A declared set of context attribute names (None: not declared)."""
    if names is None:
        return None
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise TypeError(f"PipelineTask {task!r}: {what} must be a collection of context attribute names, e.g. "
                        f"{what}=(\"x\", \"loss\"), got {names!r}")
    found = frozenset(names)
    for name in found:
        if not isinstance(name, str) or not name.isidentifier() or name in ("batch", "iter_idx"):
            raise ValueError(f"PipelineTask {task!r}: {what} names context attributes as on the context (\"x\" "
                             f"for ctx.x), other than batch and iter_idx; got {name!r}")
    return found


def _describe(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


@dataclass(frozen=True)
class TaskSchedule:
    """How one task is scheduled: its stage, stream, worker thread group and ordering.

    Args:
        stage: pipeline stage; in period ``p`` the task works on iteration ``p - stage``.
        stream: ``None`` for the device's default stream, a name (the engine creates
            one stream per name) or a torch stream object.
        thread_group: tasks of one group run serially on one worker thread.
        globally_ordered: submit in one pre-assigned order on every rank (collectives).
    """

    stage: int = 0
    stream: StreamSpec = None
    thread_group: str = "default"
    globally_ordered: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stage, bool) or not isinstance(self.stage, int):
            raise TypeError(f"TaskSchedule: stage must be an int, got {self.stage!r}")
        if self.stage > MAX_STAGE:
            raise ValueError(
                f"TaskSchedule: stage {self.stage} is too large: a plan whose deepest stage is s keeps s + 1 "
                f"iterations (their batches and contexts) in flight; stages are at most {MAX_STAGE}"
            )
        if not isinstance(self.thread_group, str) or not self.thread_group:
            raise TypeError(f"TaskSchedule: thread_group must be a non-empty str, got {self.thread_group!r}")
        if not isinstance(self.globally_ordered, bool):
            raise TypeError(f"TaskSchedule: globally_ordered must be a bool, got {self.globally_ordered!r}")
        _check_stream(self.stream)


MAX_STAGE = 1024


def _check_stream(spec: StreamSpec) -> None:
    """A stream spec is None, a non-empty name, or an object that behaves like a torch stream."""
    if spec is None:
        return
    if isinstance(spec, str):
        if not spec:
            raise ValueError("TaskSchedule: a stream name must be non-empty (use None for the default stream)")
        return
    if callable(getattr(spec, "wait_event", None)) and callable(getattr(spec, "wait_stream", None)):
        return
    kind = type(spec)
    if kind.__module__ == "torch" and kind.__qualname__ == "device":
        what, hint = f"torch.device {str(spec)!r}", (": a device says where streams live, not which one; give the "
                                                      "pipeline the device (device=...) and the task a stream name")
    else:
        shown = repr(spec)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        what, hint = f"{kind.__qualname__} {shown}", ""
    raise TypeError(
        f"TaskSchedule: stream must be None (the default stream), a stream name (str) or a torch stream object; "
        f"got {what}{hint}"
    )


TaskRef = Union[PipelineTask, str]
Dependency = Tuple[TaskRef, TaskRef]
InterDependency = Union[Tuple[TaskRef, TaskRef], Tuple[TaskRef, TaskRef, int]]  # (task, depends_on[, distance])
Back = Tuple[str, int]  # an inter-iteration dependency resolved: (task name, distance)
InterEntry = Union[Tuple[str, str], Tuple[str, str, int]]  # one by name, as declared: (task, dep[, distance])


class NamedOnlyTask(PipelineTask):
    """A task declared by a string schedule key: it can be planned and printed, not run."""

    def __init__(self, name: str) -> None:
        def no_function(ctx: IterContext) -> None:
            raise RuntimeError(
                f"task {name!r} has no function: the plan's schedule names it by a string; "
                f"key the schedule with PipelineTask({name!r}, fn) to run it"
            )

        super().__init__(name, no_function)

    def __repr__(self) -> str:
        return f"NamedOnlyTask({self.name!r})"


@dataclass
class PipelinePlan:
    """A complete scheduling plan: the task set (schedule keys), per-task schedules and dependencies.

    Args:
        schedule: task -> TaskSchedule (a mapping, or a sequence of pairs). Keys are
            PipelineTask objects; a string key declares a task that can be planned
            and printed but not run.
        intra_iter_deps: ``(task, depends_on)`` pairs within one iteration.
        inter_iter_deps: ``(task, depends_on)`` pairs: task at iteration ``i`` needs
            ``depends_on`` at iteration ``i - 1``; or ``(task, depends_on, d)`` triples: at
            iteration ``i - d`` (``d >= 1``; a pair is ``d = 1``). Each task's iterations run in
            order, so a dependency declared at two distances keeps the smaller.
        pipeline_depth: ``max(stage) + 1``; inferred when omitted, checked when given.

    Raises:
        TypeError: a field has the wrong type.
        ValueError: duplicate names, unknown references, self-dependencies, a cycle
            among intra-iteration dependencies, or a contradicting pipeline_depth.
    """

    schedule: Union[Mapping[Any, TaskSchedule], Sequence[Tuple[Any, TaskSchedule]]]  # keys: TaskRef
    intra_iter_deps: Sequence[Dependency] = field(default_factory=list)
    inter_iter_deps: Sequence[InterDependency] = field(default_factory=list)
    pipeline_depth: Optional[int] = None

    def __post_init__(self) -> None:
        self.tasks: List[PipelineTask] = []
        self.schedules: Dict[str, TaskSchedule] = {}
        self._collect_tasks()
        self.intra: Dict[str, List[str]] = self._resolve_deps("intra_iter_deps", self.intra_iter_deps)
        self.inter: Dict[str, List[Back]] = self._resolve_inter(self.inter_iter_deps)
        for name, deps in self.intra.items():
            if name in deps:
                raise ValueError(
                    f"intra_iter_deps: {name!r} depends on itself; remove the pair "
                    f"(a task at iteration i-1 is expressed with inter_iter_deps)"
                )
        _check_acyclic(self.task_names, self.intra)
        inferred = max(s.stage for s in self.schedules.values()) + 1
        self.depth: int = inferred
        if self.pipeline_depth is None:
            self.pipeline_depth = inferred
        elif isinstance(self.pipeline_depth, bool) or not isinstance(self.pipeline_depth, int):
            raise TypeError(f"pipeline_depth must be an int or None, got {self.pipeline_depth!r}")
        elif self.pipeline_depth != inferred:
            deepest = [n for n, s in self.schedules.items() if s.stage == inferred - 1]
            raise ValueError(
                f"pipeline_depth={self.pipeline_depth} contradicts the stages: max(stage) + 1 = {inferred} "
                f"(deepest tasks: {deepest}); omit pipeline_depth or set it to {inferred}"
            )

    # -- construction helpers -------------------------------------------------------------

    def _collect_tasks(self) -> None:
        items: Iterable[Any]
        if isinstance(self.schedule, Mapping):
            items = self.schedule.items()
        elif isinstance(self.schedule, (list, tuple)):
            items = self.schedule
        else:
            raise TypeError(
                f"schedule must be a dict of task -> TaskSchedule, got {type(self.schedule).__name__}"
            )
        for item in items:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise TypeError(f"schedule: entries must be (task, TaskSchedule) pairs, got {item!r}")
            key, sched = item
            task: PipelineTask
            if isinstance(key, str):
                task = NamedOnlyTask(key)
            elif isinstance(key, PipelineTask):
                task = key
            else:
                raise TypeError(
                    f"schedule: keys must be PipelineTask objects or names, got {type(key).__name__} {key!r}"
                )
            if not isinstance(sched, TaskSchedule):
                raise TypeError(
                    f"schedule[{task.name!r}]: expected a TaskSchedule, got {type(sched).__name__}"
                )
            if sched.stage < 0:
                raise ValueError(
                    f"schedule[{task.name!r}]: stage {sched.stage} is negative; stages count from 0 "
                    f"(stage k works on iteration period - k)"
                )
            if task.name in self.schedules:
                first = self.task(task.name)
                if isinstance(task, NamedOnlyTask) or isinstance(first, NamedOnlyTask):
                    raise ValueError(f"schedule: duplicate task name {task.name!r}; every task needs a unique name")
                raise ValueError(
                    f"schedule: two different tasks are named {task.name!r} (functions {_describe(first.fn)} and "
                    f"{_describe(task.fn)}); every task needs its own name: rename one of them")
            self.tasks.append(task)
            self.schedules[task.name] = sched
        if not self.tasks:
            raise ValueError("schedule is empty: a plan needs at least one task")

    def _resolve(self, where: str, ref: Any) -> str:
        if isinstance(ref, PipelineTask):
            name = ref.name
            if name in self.schedules and self.task(name) is not ref:
                raise ValueError(
                    f"{where}: the PipelineTask named {name!r} is not the object in the schedule (another object "
                    f"with the same name, whose function and io the plan would ignore); refer to the scheduled "
                    f"task object or to its name"
                )
        elif isinstance(ref, str):
            name = ref
        else:
            raise TypeError(f"{where}: tasks are referred to by PipelineTask or name, got {type(ref).__name__} {ref!r}")
        if name not in self.schedules:
            raise ValueError(
                f"{where}: unknown task {name!r}; add it to the schedule or fix the name "
                f"(known: {sorted(self.schedules)})"
            )
        return name

    def _resolve_deps(self, where: str, deps: object) -> Dict[str, List[str]]:
        if isinstance(deps, (str, bytes)) or not isinstance(deps, (list, tuple)):
            raise TypeError(f"{where} must be a list of (task, depends_on) pairs, got {type(deps).__name__}")
        resolved: Dict[str, List[str]] = {t.name: [] for t in self.tasks}
        for pair in deps:
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise TypeError(f"{where}: entries must be (task, depends_on) pairs, got {pair!r}")
            task = self._resolve(where, pair[0])
            dep = self._resolve(where, pair[1])
            if dep not in resolved[task]:
                resolved[task].append(dep)
        return resolved

    def _resolve_inter(self, deps: object) -> Dict[str, List[Back]]:
        where = "inter_iter_deps"
        if isinstance(deps, (str, bytes)) or not isinstance(deps, (list, tuple)):
            raise TypeError(f"{where} must be a list of (task, depends_on) pairs or (task, depends_on, distance) "
                            f"triples, got {type(deps).__name__}")
        nearest: Dict[str, Dict[str, int]] = {t.name: {} for t in self.tasks}
        for entry in deps:
            if not (isinstance(entry, tuple) and len(entry) in (2, 3)):
                raise TypeError(f"{where}: entries must be (task, depends_on) pairs or (task, depends_on, distance) "
                                f"triples, got {entry!r}")
            task, dep = self._resolve(where, entry[0]), self._resolve(where, entry[1])
            distance = entry[2] if len(entry) == 3 else 1
            if isinstance(distance, bool) or not isinstance(distance, int):
                raise TypeError(f"{where}: the distance of ({task!r}, {dep!r}) must be an int >= 1 (the task at "
                                f"iteration i needs {dep!r} at iteration i - distance), got {distance!r}")
            if distance < 1:
                raise ValueError(f"{where}: the distance of ({task!r}, {dep!r}) is {distance}; it must be >= 1 (the "
                                 f"task at iteration i needs {dep!r} at iteration i - distance); a dependency in the "
                                 f"same iteration goes in intra_iter_deps")
            known = nearest[task].get(dep)
            nearest[task][dep] = distance if known is None else min(known, distance)
        return {task: list(found.items()) for task, found in nearest.items()}

    # -- queries ------------------------------------------------------------------------------

    @property
    def task_names(self) -> List[str]:
        return [t.name for t in self.tasks]

    def task(self, name: str) -> PipelineTask:
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(name)

    def stage(self, name: str) -> int:
        return self.schedules[name].stage

    def inter_entries(self) -> List[InterEntry]:
        """The inter-iteration dependencies as declared, by name: ``(task, dep)`` at distance 1, else
        ``(task, dep, distance)``."""
        return [(task, dep) if back == 1 else (task, dep, back) for task in self.task_names
                for dep, back in self.inter[task]]

    @property
    def reach(self) -> int:
        """How many iterations back the furthest inter-iteration dependency reaches (1 when there is none)."""
        return max([1] + [d for deps in self.inter.values() for _, d in deps])


def _check_acyclic(names: List[str], deps: Dict[str, List[str]]) -> None:
    """Raise ValueError naming one cycle of the intra-iteration dependency graph, if any."""
    white, grey, black = 0, 1, 2
    color = {n: white for n in names}
    for root in names:
        if color[root] != white:
            continue
        stack: List[Tuple[str, int]] = [(root, 0)]
        path: List[str] = [root]
        color[root] = grey
        while stack:
            node, idx = stack[-1]
            children = deps[node]
            if idx < len(children):
                stack[-1] = (node, idx + 1)
                child = children[idx]
                if color[child] == grey:
                    cycle = path[path.index(child):] + [child]
                    raise ValueError(
                        "intra_iter_deps: dependency cycle " + " -> ".join(repr(c) for c in cycle)
                        + " (read 'a -> b' as 'a depends on b'); a plan's intra-iteration dependencies must "
                        "form a DAG: remove one pair, or make it an inter_iter_deps pair if it refers to i-1"
                    )
                if color[child] == white:
                    color[child] = grey
                    stack.append((child, 0))
                    path.append(child)
            else:
                color[node] = black
                stack.pop()
                path.pop()
