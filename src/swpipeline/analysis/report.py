"""Is my plan right? ``analyze`` checks a plan's dependencies against what its tasks really touch.

One iteration runs serially (the plan's serial order, the caller's thread) while
``access.py`` records what each task reads, writes and deletes. Two tasks *conflict* on
a name when both touch it and at least one writes it: read-after-write (RAW),
write-after-read (WAR) or write-after-write (WAW), from the serial order's point of view.

* Context attributes belong to one iteration: they conflict within it (intra). A value
  changed in place writes the attribute it was read from; reading ``vars(ctx)`` as a
  whole reads every attribute a task of the iteration writes.
* State outside the context (parameters, ``.grad``, optimizer state, buffers,
  ``DeclaredIO`` state, random generators, which every draw reads and advances) is
  shared: it conflicts within an iteration and between consecutive ones (inter: the
  task of iteration i against the task of i-1). Longer distances need no check: a chain
  through the writer's own iterations orders them once every consecutive pair is ordered.

A conflict is fine when the declared dependencies order it (transitively, see
``races.HappensBefore``). One ordered only by the placement (the same thread group
or stream, which runs the schedule's order on both engines) is a *warning*: another
thread group or stream would break it. Anything else is a *missing dependency*. Both
lists are minimal: a pair that the declared dependencies plus the other reported pairs
already imply is left out.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import AbstractSet, Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, TypeVar, Union

from ..plan import ordering
from .access import DRAW, READ, READ_ALL, IterationAccess, StateRecorder, TaskAccess, recording_view
from ..errors import annotate, stop_iteration_error
from ..plan.context import IterContext
from ..plan.model import NamedOnlyTask, PipelinePlan, PipelineTask
from .races import HappensBefore, InterDeps, Placement, conflict_clause, dependency_fix, draw_hint, staleness_hint

__all__: List[str] = []

T = TypeVar("T")
Edge = Tuple[str, str, int]  # (task, depends_on, distance): task(i) after depends_on(i - distance)
Touch = Tuple[str, str, str]  # (name, how depends_on touched it, how task touched it)
Entry = Tuple[str, str, str, str]  # (task, depends_on, "intra" | "inter", reason)


def record_iteration(tasks: Sequence[PipelineTask], batch: Any, warmup: int = 0,
                     roots: Optional[Mapping[str, Any]] = None) -> IterationAccess:
    """Run ``tasks`` in order on fresh contexts: ``warmup`` iterations (0, 1, ...) as they are, then one more
    recording what each task touches (see ``access.py``)."""
    for iter_idx in range(warmup):
        ctx = IterContext(batch, iter_idx)
        for task in tasks:
            _call(task, functools.partial(task.fn, ctx), iter_idx)
    recorder = StateRecorder(tasks, batch, roots or {})
    ctx = IterContext(batch, warmup)
    accesses: Dict[str, TaskAccess] = {}
    for task in tasks:
        access = accesses[task.name] = TaskAccess()
        view, finish = recording_view(ctx, functools.partial(_note_attribute, access))
        finish(_call(task, functools.partial(recorder.run, task, functools.partial(task.fn, view), access), warmup))
    _settle_context(accesses)
    return IterationAccess([t.name for t in tasks], accesses, recorder.state, recorder.weights)


def _settle_context(accesses: Mapping[str, TaskAccess]) -> None:
    """Reading every attribute at once reads each one any task writes; ``ctx.batch`` counts once a task changes it."""
    changed = {n for a in accesses.values() for n in a.writes | a.deletes if n.startswith("ctx.")}
    for access in accesses.values():
        if access.reads_all:
            access.reads |= changed - {"ctx.batch"}
        if "ctx.batch" not in changed:
            access.reads.discard("ctx.batch")


def _call(task: PipelineTask, call: Callable[[], T], iter_idx: int) -> T:
    """``call()``, its exception annotated with the task and iteration (a StopIteration made a RuntimeError)."""
    try:
        return call()
    except StopIteration as exc:
        raise annotate(stop_iteration_error(exc, task.name, iter_idx), task.name, iter_idx) from exc
    except BaseException as exc:
        raise annotate(exc, task.name, iter_idx)


def _note_attribute(access: TaskAccess, kind: str, name: str) -> None:
    access.note(kind, "" if kind == READ_ALL else f"ctx.{name}")


def _hazard(first: TaskAccess, second: TaskAccess, name: str) -> Optional[Tuple[str, str]]:
    """How ``first`` and then ``second`` touch ``name`` in a conflict (WAR before RAW before WAW), or None."""
    if second.modifies(name) and name in first.reads:
        return READ, second.modify_kind(name)
    if name in second.reads and first.modifies(name):
        return first.modify_kind(name), READ
    if first.modifies(name) and second.modifies(name):
        return first.modify_kind(name), second.modify_kind(name)
    return None


def required_orderings(record: IterationAccess) -> Dict[Edge, List[Touch]]:
    """Every ordering the recorded accesses need: ``task(i)`` after ``depends_on(i - distance)``, and why.

    Within the iteration, the later task in the recorded order follows the earlier one;
    between iterations (state only), every task follows every other of the iteration before.
    """
    out: Dict[Edge, List[Touch]] = {}
    tasks = record.tasks
    for j, task in enumerate(record.order):
        for i, dep in enumerate(record.order):
            if dep == task:
                continue
            shared = tasks[dep].touched & tasks[task].touched
            for distance in (0, 1) if i < j else (1,):
                for name in sorted(shared if distance == 0 else shared & record.state):
                    how = _hazard(tasks[dep], tasks[task], name)
                    if how is not None:
                        out.setdefault((task, dep, distance), []).append((name, how[0], how[1]))
    position = {name: k for k, name in enumerate(record.order)}
    return dict(sorted(out.items(), key=lambda item: (item[0][2], position[item[0][0]], position[item[0][1]])))


def reduce_edges(names: Sequence[str], intra: Mapping[str, Sequence[str]], inter: InterDeps,
                 candidates: Sequence[Edge], given: Sequence[Edge] = ()) -> List[Edge]:
    """The candidates that the dependencies, the ``given`` edges and the other kept candidates do not imply."""
    kept = list(candidates)
    for edge in candidates:
        others = [e for e in kept if e != edge] + list(given)
        relation = HappensBefore(names, _merge(intra, others, 0), _merge_back(inter, others))
        if relation.before(edge[1], edge[0], edge[2]):
            kept = [e for e in kept if e != edge]
    return kept


def _merge(deps: Mapping[str, Sequence[str]], edges: Sequence[Edge], distance: int) -> Dict[str, List[str]]:
    merged = {task: list(found) for task, found in deps.items()}
    for task, dep, d in edges:
        if d == distance:
            merged.setdefault(task, []).append(dep)
    return merged


def _merge_back(deps: InterDeps, edges: Sequence[Edge]) -> Dict[str, List[Union[str, Tuple[str, int]]]]:
    merged: Dict[str, List[Union[str, Tuple[str, int]]]] = {task: list(found) for task, found in deps.items()}
    for task, dep, d in edges:
        if d:
            merged.setdefault(task, []).append((dep, d))
    return merged


def _names_text(names: Sequence[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def conflict_text(task: str, dep: str, touches: Sequence[Touch]) -> str:
    """``Forward reads `w`, which OptimizerStep writes``, one clause per way the two touch their names."""
    groups: Dict[Tuple[str, str], List[str]] = {}
    for name, dep_kind, task_kind in touches:
        groups.setdefault((dep_kind, task_kind), []).append(name)
    return "; ".join(conflict_clause(dep, dep_kind, task, task_kind, _names_text(names))
                     for (dep_kind, task_kind), names in groups.items())


@dataclass
class PlanAnalysis:
    """What ``analyze`` found: each task's reads and writes, and the dependencies the plan lacks.

    ``missing_deps`` and ``warnings`` hold ``(task, depends_on, kind, reason)`` with ``kind``
    ``"intra"`` or ``"inter"``; ``reason`` says who reads what the other writes and the exact
    dependency to add. A warning is a conflict only the placement orders.
    """

    plan: PipelinePlan
    iter_idx: int
    order: List[str]
    reads: Dict[str, Set[str]]
    writes: Dict[str, Set[str]]  # assigned, modified in place, drawn from (a generator) or deleted
    state: Set[str]  # the names outside the context
    missing_deps: List[Entry] = field(default_factory=list)
    warnings: List[Entry] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No missing dependency (warnings allowed)."""
        return not self.missing_deps

    def fixed_plan(self) -> PipelinePlan:
        """The plan with every missing dependency added (warnings not included)."""
        plan = self.plan
        intra = [(t, d) for t, d, kind, _ in self.missing_deps if kind == "intra"]
        inter = [(t, d) for t, d, kind, _ in self.missing_deps if kind == "inter"]
        return PipelinePlan(schedule=plan.schedule, intra_iter_deps=[*plan.intra_iter_deps, *intra],
                            inter_iter_deps=[*plan.inter_iter_deps, *inter], pipeline_depth=plan.pipeline_depth)

    def report(self) -> str:
        """The findings as text: missing dependencies, warnings, then what each task touched."""
        lines = [f"plan analysis (one serial iteration, iter_idx {self.iter_idx}): {', '.join(self.order)}"]
        for title, entries in (("missing dependencies", self.missing_deps),
                               ("warnings (ordered only by the placement)", self.warnings)):
            lines.append(f"{title}: {len(entries) or 'none'}")
            lines += [f"  - {reason}" for _, _, _, reason in entries]
        lines.append("what each task touched:")
        width = max(len(n) for n in self.order)
        for name in self.order:
            reads = _names_text(sorted(self.reads[name])) or "-"
            writes = _names_text(sorted(self.writes[name])) or "-"
            lines.append(f"  {name:<{width}}  reads {reads}; writes {writes}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()


def analyze(plan: PipelinePlan, batch: Any, *, warmup: int = 0, roots: Optional[Mapping[str, Any]] = None,
            accept: Sequence[Tuple[str, str]] = ()) -> PlanAnalysis:
    """Check a plan against what its tasks touch in one serially run iteration.

    Args:
        plan: the plan to check; its tasks run once, in the plan's serial order, on the
            calling thread, with their real side effects (a training step trains).
        batch: the batch of the analysed iteration (``ctx.batch``).
        warmup: iterations to run first on the same batch, unrecorded, so that state the first
            iteration creates (``.grad``, optimizer state) exists; the analysed iteration's
            ``ctx.iter_idx`` is ``warmup``.
        roots: extra named objects (modules, optimizers, tensors) to name state by, for
            objects the task functions do not reach: ``{"model": model}``.
        accept: ``(task, depends_on)`` pairs whose conflicts the plan means to keep, in either
            iteration distance: e.g. semi-synchronous training, where a lookup reads
            embeddings one update old on purpose.

    Returns:
        A PlanAnalysis; ``print(analysis)`` shows the report.

    Raises:
        TypeError: ``plan`` is not a PipelinePlan, ``roots`` is not a mapping, ``warmup`` not an int.
        ValueError: a task has no function (a schedule keyed by name), the plan breaks a stage rule,
            or ``warmup`` is negative.
        Exception: whatever a task raised, with a note naming the task and the iteration.
    """
    if not isinstance(plan, PipelinePlan):
        raise TypeError(f"analyze: plan must be a PipelinePlan, got {type(plan).__name__}")
    check_recording_args("analyze", plan.tasks, warmup, roots)
    ordering.validate_stages(plan)
    order = ordering.serial_order(plan)
    record = record_iteration([plan.task(n) for n in order], batch, warmup, roots)
    accepted = _accepted(plan, accept)
    required = {edge: why for edge, why in required_orderings(record).items() if edge[:2] not in accepted}
    missing, warned = classify(plan, required, optimizer_steps(record))
    tasks = record.tasks
    return PlanAnalysis(plan, warmup, order, {n: set(tasks[n].reads) for n in order},
                        {n: tasks[n].writes | tasks[n].deletes for n in order}, set(record.state), missing, warned)


def _accepted(plan: PipelinePlan, accept: Sequence[Tuple[str, str]]) -> Set[Tuple[str, str]]:
    pairs = set()
    for pair in accept:
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(n, str) for n in pair)):
            raise TypeError(f"analyze: accept holds (task, depends_on) pairs of task names, got {pair!r}")
        unknown = [n for n in pair if n not in plan.schedules]
        if unknown:
            raise ValueError(f"analyze: accept names unknown task(s) {unknown}; the plan's tasks are {plan.task_names}")
        pairs.add(pair)
    return pairs


def check_recording_args(where: str, tasks: Sequence[PipelineTask], warmup: object, roots: object) -> None:
    """Refuse what cannot be recorded: tasks without a function, a bad ``warmup`` or ``roots``."""
    if isinstance(warmup, bool) or not isinstance(warmup, int):
        raise TypeError(f"{where}: warmup must be an int (iterations to run before the recorded one), got {warmup!r}")
    if warmup < 0:
        raise ValueError(f"{where}: warmup must be >= 0, got {warmup}")
    if roots is not None and not isinstance(roots, Mapping):
        raise TypeError(f"{where}: roots must be a mapping of name -> object, got {type(roots).__name__}")
    unnamed = [t.name for t in tasks if isinstance(t, NamedOnlyTask)]
    if unnamed:
        raise ValueError(f"{where}: tasks {unnamed} have no function (the schedule names them by a string); key the "
                         f"schedule with PipelineTask(name, fn) to record them")


def optimizer_steps(record: IterationAccess) -> Dict[str, Set[str]]:
    """Per task, the module weights it updates from their gradients (reads or clears ``w.grad``, writes ``w``),
    as an optimizer step does."""
    found: Dict[str, Set[str]] = {}
    for name, access in record.tasks.items():
        touched = access.reads | access.writes | access.deletes
        found[name] = {w for w in record.weights if w in access.writes and f"{w}.grad" in touched}
    return found


def classify(plan: PipelinePlan, required: Dict[Edge, List[Touch]],
             steps: Optional[Mapping[str, AbstractSet[str]]] = None) -> Tuple[List[Entry], List[Entry]]:
    """Split the orderings the declared dependencies lack into missing ones and placement-ordered ones
    (``steps``: the weights each task updates as an optimizer step, see ``optimizer_steps``)."""
    relation, placement = HappensBefore.of_plan(plan), Placement(plan)
    missing: List[Edge] = []
    placed: List[Edge] = []
    for edge in required:
        task, dep, distance = edge
        if not relation.before(dep, task, distance):
            (placed if placement.before(dep, task, distance) else missing).append(edge)
    missing = reduce_edges(plan.task_names, plan.intra, plan.inter, missing)
    placed = reduce_edges(plan.task_names, plan.intra, plan.inter, placed, given=missing)

    def entry(edge: Edge, is_missing: bool) -> Entry:
        task, dep, distance = edge
        later = "i+1" if distance else "i"
        clauses = conflict_text(task, dep, required[edge])
        fix = dependency_fix(placement.stage, task, dep, distance)
        drawn = [name for name, dep_kind, _ in required[edge] if dep_kind == DRAW]
        fix += draw_hint(drawn[0]) if drawn else ""
        trained = [name for name, _, task_kind in required[edge]
                   if steps is not None and name in steps.get(dep, ()) and task_kind == READ]
        gap = placement.stage[dep] - placement.stage[task]
        if is_missing and distance == 1 and trained and gap >= 1:  # (at gap 0 the dependency costs no overlap)
            fix += staleness_hint(task, dep, gap)
        if is_missing:
            verb = "runs" if placement.before(dep, task, distance) is False else "may run"
            reason = f"{clauses}; in a pipelined run {task}({later}) {verb} before {dep}(i): {fix}"
        else:
            reason = (f"{clauses}; {task}({later}) runs after {dep}(i) only because both run on "
                      f"{placement.shared(task, dep)}, and would race on other thread groups or streams: {fix}")
        return task, dep, "inter" if distance else "intra", reason

    return [entry(e, True) for e in missing], [entry(e, False) for e in placed]
