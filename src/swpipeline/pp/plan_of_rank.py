"""One rank's units (``units.py``) as a swpipeline ``PipelinePlan``: a step is one iteration of it.

Every unit is a task at stage 0 on its unit's thread group and stream: the compute
actions, sends and receives on the ``compute`` thread (the sends to and receives from rank
``q``, HELLO and DONE too, each on a stream of their own, ``send{q}`` and ``recv{q}``). The
tasks of a group are chained by intra-iteration dependencies in the group's order, and each task
also depends on the units it waits for, so the engine runs exactly the order that
``check.prove`` proved across ranks; ``engine_orders`` reads that order back from the
engine to make sure of it.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Tuple

from ..engine.clocked import SWPipeline
from ..plan.context import IterContext
from ..plan.model import PipelinePlan, PipelineTask, TaskSchedule
from .units import RankUnits, Unit

__all__: List[str] = []

TaskFn = Callable[[IterContext], None]


def plan_of_rank(units: RankUnits, task_fn: Callable[[Unit], TaskFn]) -> PipelinePlan:
    """The rank's plan: a task per unit (``task_fn(unit)`` runs it), on the unit's group, chained in group order."""
    tasks: Dict[str, PipelineTask] = {}
    schedule: Dict[PipelineTask, TaskSchedule] = {}
    for group, group_units in units.items():
        for unit in group_units:
            task = PipelineTask(unit.name, task_fn(unit))
            tasks[unit.name] = task
            schedule[task] = TaskSchedule(stage=0, stream=unit.stream, thread_group=group)
    intra: List[Tuple[PipelineTask, PipelineTask]] = []
    for group_units in units.values():
        for before, unit in zip(group_units, group_units[1:]):
            intra.append((tasks[unit.name], tasks[before.name]))
        for unit in group_units:
            intra += [(tasks[unit.name], tasks[dep]) for dep in unit.deps]
    return PipelinePlan(schedule=schedule, intra_iter_deps=intra)


def engine_orders(pipe: SWPipeline) -> Dict[str, List[str]]:
    """Each thread group's tasks in the order the engine runs them (one iteration, every task at stage 0)."""
    orders: Dict[str, List[str]] = {}
    for name in pipe.enqueue_order:
        orders.setdefault(pipe.plan.schedules[name].thread_group, []).append(name)
    return orders


def check_engine_runs(pipe: SWPipeline, units: RankUnits) -> None:
    """Raise RuntimeError if the engine would run a group's units in another order than the proved one."""
    expected = {group: [u.name for u in group_units] for group, group_units in units.items() if group_units}
    found = engine_orders(pipe)
    if found != expected:
        raise RuntimeError(f"swpipeline.pp: the engine's order {found} differs from the proved order {expected}; "
                           f"this is a bug, please report it")
