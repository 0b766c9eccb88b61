"""Dependencies from data: ``infer_deps`` derives a plan's dependencies from what its tasks touch.

The schedule lists the tasks in the order one iteration must run them (the order of a
plain training loop). One iteration runs in that order while ``access.py`` records what
each task reads, writes and deletes; every conflict (see ``analysis.py``) becomes a
dependency:

* within the iteration, the later task depends on the earlier one (intra);
* on state outside the context, each task of iteration i depends on every other task of
  iteration i-1 it conflicts with (inter); a task's own iterations are ordered anyway.

The result is then transitively reduced: a pair that the others imply (through intra
chains, inter pairs and each task's own previous iteration) is dropped, so two plans
with the same ordering infer the same minimal lists. Every ordering the data needs is
declared, including one that the placement would provide (a shared thread group or
stream), so the plan stays right on any thread group and stream.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Tuple

from .report import Edge, check_recording_args, conflict_text, record_iteration, reduce_edges, required_orderings
from ..plan.model import PipelineTask, TaskSchedule
from .races import stage_fix

__all__: List[str] = []

TaskPair = Tuple[PipelineTask, PipelineTask]


def infer_deps(schedule: Mapping[PipelineTask, TaskSchedule], batch: Any, *, warmup: int = 0,
               roots: Optional[Mapping[str, Any]] = None) -> Tuple[List[TaskPair], List[TaskPair]]:
    """The minimal ``(intra_iter_deps, inter_iter_deps)`` that order what a schedule's tasks touch.

    Args:
        schedule: task -> TaskSchedule, in the order one iteration runs the tasks serially.
        batch: the batch of the recorded iteration.
        warmup: iterations to run first on the same batch, unrecorded (see ``analyze``).
        roots: extra named objects to name state by (see ``analyze``).

    Returns:
        ``(intra_iter_deps, inter_iter_deps)``: lists of ``(task, depends_on)`` pairs of the
        schedule's task objects, ready for ``PipelinePlan(schedule, intra, inter)``.

    Raises:
        TypeError: ``schedule`` is not a mapping of PipelineTask -> TaskSchedule.
        ValueError: a needed dependency breaks a stage rule (the message names both tasks,
            what they touch and the stages that would work), or duplicate task names.
        Exception: whatever a task raised, with a note naming the task and the iteration.
    """
    tasks = _check_schedule(schedule)
    check_recording_args("infer_deps", tasks, warmup, roots)
    record = record_iteration(tasks, batch, warmup, roots)
    required = required_orderings(record)
    stage = {t.name: schedule[t].stage for t in tasks}
    for (task, dep, distance), touches in required.items():
        moves = stage_fix(stage, task, dep, distance)
        if moves is not None:
            when = "within the iteration" if distance == 0 else "across consecutive iterations"
            raise ValueError(f"infer_deps: {conflict_text(task, dep, touches)} ({when}), so {task} must depend on "
                             f"{dep}{' of the iteration before' if distance else ''}, which the stages forbid: {moves}")
    names = [t.name for t in tasks]
    edges: List[Edge] = list(required)
    intra = _reduce_intra(names, [e for e in edges if e[2] == 0])
    intra_map = {n: [d for t, d, _ in intra if t == n] for n in names}
    inter = reduce_edges(names, intra_map, {}, [e for e in edges if e[2] == 1])
    by_name = {t.name: t for t in tasks}
    position = {n: k for k, n in enumerate(names)}

    def pairs(found: Sequence[Edge]) -> List[TaskPair]:
        ordered = sorted(found, key=lambda e: (position[e[0]], position[e[1]]))
        return [(by_name[t], by_name[d]) for t, d, _ in ordered]

    return pairs(intra), pairs(inter)


def _reduce_intra(names: Sequence[str], edges: Sequence[Edge]) -> List[Edge]:
    """The transitive reduction of the intra-iteration pairs (a DAG: the recorded order is a linear extension)."""
    return reduce_edges(names, {}, {}, edges)


def _check_schedule(schedule: object) -> List[PipelineTask]:
    if not isinstance(schedule, Mapping):
        raise TypeError(f"infer_deps: schedule must be a dict of PipelineTask -> TaskSchedule, in serial order; got "
                        f"{type(schedule).__name__}")
    tasks: List[PipelineTask] = []
    for task, sched in schedule.items():
        if not isinstance(task, PipelineTask):
            raise TypeError(f"infer_deps: schedule keys must be PipelineTask objects (infer_deps runs them), got "
                            f"{type(task).__name__} {task!r}")
        if not isinstance(sched, TaskSchedule):
            raise TypeError(f"infer_deps: schedule[{task.name!r}] must be a TaskSchedule, got {type(sched).__name__}")
        if any(t.name == task.name for t in tasks):
            raise ValueError(f"infer_deps: duplicate task name {task.name!r}; every task needs a unique name")
        tasks.append(task)
    if not tasks:
        raise ValueError("infer_deps: schedule is empty: give it the tasks of one iteration, in serial order")
    return tasks
