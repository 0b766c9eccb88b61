"""A plan compiled for the simulator: the engine's own schedule, and per task what the time layer reads.

The schedule is not re-derived here: ``compile_plan`` builds it exactly as a pipeline
does (``runtime.build_tasks`` on a CPU device, then ``Schedule.build``), so the
simulated submission order, each thread group's slots and the turns are the ones
the engines run, and the simulator hands it to the engine's interpreter of units
(``engine/interpreter.py``). What is added is what the time layer needs per task as
flat tuples: its thread group, its stream, its dependencies, the serial order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ..plan import ordering
from ..devices.device import CPUDevice
from ..plan.model import PipelinePlan
from ..engine.runtime import build_tasks
from ..engine.release import rule_of
from ..engine.schedule import Schedule

__all__: List[str] = []


@dataclass(frozen=True)
class CompiledPlan:
    """The plan's schedule as the simulator reads it (task indices are plan order)."""

    plan: PipelinePlan
    schedule: Schedule
    names: Tuple[str, ...]
    depth: int
    groups: Tuple[str, ...]  # thread groups, in the order the engines hand out work
    group_of: Tuple[int, ...]  # task -> group index
    stream_of: Tuple[int, ...]  # task -> stream index
    streams: Tuple[str, ...]  # stream labels
    intra: Tuple[Tuple[int, ...], ...]  # task -> its intra-iteration dependencies
    inter: Tuple[Tuple[Tuple[int, int], ...], ...]  # task -> its inter-iteration ones: (task, d), iteration i - d
    serial_order: Tuple[int, ...]

    @property
    def n(self) -> int:
        return len(self.names)


def compile_plan(plan: PipelinePlan) -> CompiledPlan:
    """The schedule of ``plan`` as the engines build it.

    Raises:
        ValueError: the plan breaks a stage rule.
    """
    ordering.validate_stages(plan)
    tasks = build_tasks(plan, CPUDevice())
    schedule = Schedule.build(plan, {t.name: t.stream_label for t in tasks}, {t.name: t.stream for t in tasks})
    groups = tuple(schedule.group_slots())
    group_index = {g: k for k, g in enumerate(groups)}
    stream_ids: Dict[int, int] = {}
    labels: List[str] = []
    stream_of = []
    for t in tasks:
        if id(t.stream) not in stream_ids:
            stream_ids[id(t.stream)] = len(labels)
            labels.append(t.stream_label)
        stream_of.append(stream_ids[id(t.stream)])
    index = {name: k for k, name in enumerate(plan.task_names)}
    return CompiledPlan(
        plan=plan, schedule=schedule, names=tuple(plan.task_names), depth=schedule.depth, groups=groups,
        group_of=tuple(group_index[t.group] for t in tasks), stream_of=tuple(stream_of), streams=tuple(labels),
        intra=tuple(tuple(index[d] for d in plan.intra[n]) for n in plan.task_names),
        inter=tuple(tuple((index[d], back) for d, back in plan.inter[n]) for n in plan.task_names),
        serial_order=tuple(index[n] for n in ordering.serial_order(plan)))


def caller_group_allowed(engine: str, live: int, depth: int) -> bool:
    """Whether the engine's ``run()`` can run a thread group on the calling thread (its release rule says;
    ``run_serial`` has no groups)."""
    return engine in ("clocked", "dataflow") and rule_of(engine, depth, live).allows_caller_group


def run_caller_group(plan: PipelinePlan, engine: str, live: int, value: Optional[str]) -> Optional[str]:
    """The thread group ``run()`` runs on the calling thread for ``caller_thread_group=value`` ("auto": the
    last stage's group), or None where the engine runs none (see ``caller_group_allowed``)."""
    if value is None or not caller_group_allowed(engine, live, plan.depth):
        return None
    return ordering.last_stage_group(plan) if value == "auto" else value


def group_index(compiled: CompiledPlan, group: Optional[str]) -> Optional[int]:
    """The index of thread group ``group`` (None for None).

    Raises:
        ValueError: ``group`` is not a thread group of the plan.
    """
    if group is None:
        return None
    if group not in compiled.groups:
        raise ValueError(f"caller_thread_group={group!r} is not a thread group of the plan (its groups: "
                         f"{list(compiled.groups)})")
    return compiled.groups.index(group)
