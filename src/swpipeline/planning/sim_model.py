"""A plan compiled for the simulator: the engine's own schedule, as flat arrays.

The schedule is not re-derived here: ``compile_plan`` builds it exactly as a pipeline
does (``runtime.build_tasks`` on a CPU device, then ``Schedule.build``), so the
simulated submission order, each thread group's slots and the turns are the ones
the engines run. What is added is only what the simulator needs to go fast: per
thread group the sequence of its units for ``N`` iterations, per turn line (the
sequencer, and each stream shared by thread groups) the order its units take turns.

Unit order, the same for both engines (periods are virtual for the data-flow engine),
is the engines' own (``Schedule.walk``)::

    period p, slot k  ->  iteration p - stage(k)      keep 0 <= iteration < N
    group g's units   =   (p, k) for p = 0, 1, ...; k over g's slots in submission order
    a turn line's     =   (p, k) for p = 0, 1, ...; k over the line's slots in submission order
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ..plan import ordering
from ..devices.device import CPUDevice
from ..plan.model import PipelinePlan
from ..engine.runtime import build_tasks
from ..engine.release import ALL, Released, rule_of
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
    lines_of: Tuple[Tuple[int, ...], ...]  # task -> the turn lines it takes turns on
    num_lines: int
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
    line_ids: Dict[object, int] = {}
    lines_of: List[Tuple[int, ...]] = [() for _ in tasks]
    for slot in schedule.slots:
        lines_of[slot.index] = tuple(line_ids.setdefault(key, len(line_ids)) for key in schedule.turn_lines(slot))
    index = {name: k for k, name in enumerate(plan.task_names)}
    return CompiledPlan(
        plan=plan, schedule=schedule, names=tuple(plan.task_names), depth=schedule.depth, groups=groups,
        group_of=tuple(group_index[t.group] for t in tasks), stream_of=tuple(stream_of), streams=tuple(labels),
        intra=tuple(tuple(index[d] for d in plan.intra[n]) for n in plan.task_names),
        inter=tuple(tuple((index[d], back) for d, back in plan.inter[n]) for n in plan.task_names),
        lines_of=tuple(lines_of), num_lines=len(line_ids),
        serial_order=tuple(index[n] for n in ordering.serial_order(plan)))


@dataclass
class UnitSequences:
    """Each thread group's units for ``N`` iterations, and each turn line's order.

    ``tasks[g][h]``, ``iters[g][h]``, ``periods[g][h]``, ``positions[g][h]`` (its slot's submission position):
    the ``h``-th unit of group ``g``, in
    the order ``Schedule.walk`` gives (the one the engines hand out). ``lines[l]``: the
    units of turn line ``l`` as ``iteration * n + task``, in turn order.
    """

    tasks: List[List[int]]
    iters: List[List[int]]
    periods: List[List[int]]
    positions: List[List[int]]
    lines: List[List[int]]


def unit_sequences(compiled: CompiledPlan, num_iterations: int) -> UnitSequences:
    """The units of ``num_iterations`` iterations, per thread group and per turn line (see the module docstring)."""
    schedule, n = compiled.schedule, compiled.n
    entered = {i: i for i in range(num_iterations)}
    everything: Released = (ALL, ALL)
    horizon = num_iterations + compiled.depth - 2
    tasks: List[List[int]] = []
    iters: List[List[int]] = []
    periods: List[List[int]] = []
    positions: List[List[int]] = []
    for group in compiled.groups:
        units = schedule.walk(group, (0, 0), entered, everything, horizon)[0]
        tasks.append([slot.index for _, slot, _ in units])
        iters.append([it for _, _, it in units])
        periods.append([period for period, _, _ in units])
        positions.append([slot.position for _, slot, _ in units])
    lines: List[List[int]] = [[] for _ in range(compiled.num_lines)]
    for period in range(horizon + 1):
        for slot, it in schedule.units(period, entered):
            for line in compiled.lines_of[slot.index]:
                lines[line].append(it * n + slot.index)
    return UnitSequences(tasks, iters, periods, positions, lines)


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
