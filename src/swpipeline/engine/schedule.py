"""The clock-driven schedule as data: which task runs on which iteration, in which order, on which thread.

One period's submission order (``Schedule.slots``) is computed once from the plan. In
period ``p`` slot ``s`` works on the iteration that entered the pipeline in period
``p - s.stage``, if one did (none did before the first batch, after the last one, and
in the periods that ``progress(None)`` ran without a batch)::

    depth 3      P0   P1   P2   P3   P4          a period's units, in slot order,
    stage 2      --   --   i0   i1   i2          go to their thread groups' FIFO
    stage 1      --   i0   i1   i2   i3          queues; globally ordered slots take
    stage 0      i0   i1   i2   i3   i4          sequencer turns in the same order

Each thread group's units form one sequence, ``walk``: every period in turn, within
one the group's slots in submission order. Both engines hand out exactly that
sequence, as far as their release rule (``release.py``) allows, and number the turns
of each period in ``turn_units``' order. What a unit handed out waits for, on paper, is
``interpreter.py``'s to say; ``paper.py`` runs the schedule on paper under a release rule
(the deadlock check, the step boundary), the simulator with times; ``print_schedule``
renders the same slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, TypeVar

from ..plan import ordering
from ..plan.context import IterContext
from ..plan.model import PipelinePlan
from .release import ALL, Released

__all__: List[str] = []

T = TypeVar("T")


@dataclass(frozen=True)
class Slot:
    """One task's place in every period."""

    task: str
    index: int  # the task's position in the plan (``PipelinePlan.tasks``)
    position: int  # its position in the period's submission order
    stage: int
    group: str
    stream: str
    ordered: bool  # globally ordered: runs in its sequencer turn
    shares_stream: bool  # its stream is used by several thread groups: runs in its turn on the stream
    stream_key: int  # identifies the stream (two streams may show the same label)
    intra: Tuple[int, ...]  # plan indices of its intra-iteration dependencies
    inter: Tuple[Tuple[int, int], ...]  # ... and of its inter-iteration ones, with distances: (index, d), i - d
    takes_turns: bool = False  # ordered or shares_stream: its units run in their turn (set by build)

    def __post_init__(self) -> None:
        object.__setattr__(self, "takes_turns", self.ordered or self.shares_stream)

    def entry(self, period: int) -> int:
        """The period whose iteration this slot works on in ``period`` (negative: none yet). The walks inline it."""
        return period - self.stage


# One task on one iteration, as a thread group's order lists it: ``(period, slot, item)``, ``item`` being
# what entered in period ``period - slot.stage`` (an IterContext in the engines, an iteration on paper).
# A plain tuple, unpacked by name where it is read: a named tuple would cost 0.12 us more per unit, a
# seventh of the engine's whole cost per task.
Unit = Tuple[int, Slot, T]
Work = Unit[IterContext]  # a unit as a worker runs it
Position = Tuple[int, int]  # where a thread group's walk stands: (period, index into the group's slots)
WHOLE_PERIOD = 1 << 30  # a submission position past every slot's: "all of the period" (see runs_before_retire)


@dataclass(frozen=True)
class Schedule:
    depth: int
    slots: Tuple[Slot, ...]  # one period, in submission order
    rows: Tuple[Slot, ...]  # print_schedule's rows: stage-descending, in submission order within a stage
    turn_slots: Tuple[Slot, ...]  # the slots whose units take turns (globally ordered, or on a shared stream)
    lanes: Dict[str, Tuple[Slot, ...]]  # each thread group's slots, in submission order (groups in first-use order)
    # per group: its slots, its lowest stage, whether a slot of it takes turns (derived from ``lanes``)
    _lane_walks: Dict[str, Tuple[Tuple[Slot, ...], int, bool]] = field(init=False, repr=False, compare=False)
    # the last submission position of a slot of the last stage: in its last period an iteration is done once
    # every unit up to there is (see ``runs_before_retire``); WHOLE_PERIOD with one thread group
    retire_cut: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_lane_walks", {g: (v, min(s.stage for s in v), any(s.takes_turns for s in v))
                                                 for g, v in self.lanes.items()})
        last = [s.position for s in self.slots if s.stage == self.depth - 1]
        object.__setattr__(self, "retire_cut", max(last) if len(self.lanes) > 1 and last else WHOLE_PERIOD)

    def runs_before_retire(self, period: int, slot: Slot, through: int) -> bool:
        """Whether the caller's own group runs this unit before retiring the oldest iteration, whose last
        period is ``through`` (``release.ReleaseRule.caller_through``).

        It runs every unit of the periods before, and of that period those submitted up to the last
        unit of the last stage (``retire_cut``): the oldest iteration's units there are that stage's,
        and each waits only on units submitted before it, so once those have run the oldest can
        retire, and the next period is handed out while the caller still has the rest of this one
        to do (``progress(advance=False)`` runs the whole period first: see ``CallerWorker``). With one
        thread group nobody else could take the next period early: the caller runs its whole period.
        """
        return period < through or (period == through and slot.position <= self.retire_cut)

    @classmethod
    def build(cls, plan: PipelinePlan, stream_labels: Mapping[str, str],
              stream_keys: Mapping[str, object]) -> "Schedule":
        """The schedule of a validated plan; ``stream_keys`` identify streams (two labels may share a name)."""
        index = {name: k for k, name in enumerate(plan.task_names)}
        groups_on: Dict[int, Set[str]] = {}
        for name in plan.task_names:
            groups_on.setdefault(id(stream_keys[name]), set()).add(plan.schedules[name].thread_group)

        def slot(name: str, position: int) -> Slot:
            sched, key = plan.schedules[name], id(stream_keys[name])
            return Slot(name, index[name], position, sched.stage, sched.thread_group, stream_labels[name],
                        sched.globally_ordered, len(groups_on[key]) > 1, key,
                        tuple(index[d] for d in plan.intra[name]),
                        tuple((index[d], distance) for d, distance in plan.inter[name]))

        order = ordering.enqueue_order(plan, stream_keys)
        slots = tuple(slot(name, k) for k, name in enumerate(order))
        lanes: Dict[str, List[Slot]] = {}
        for s in slots:
            lanes.setdefault(s.group, []).append(s)
        # rows: stage-descending, in submission order within a stage, so that each stream's rows read
        # top to bottom in the order the stream runs them in a period
        return cls(plan.depth, slots, tuple(sorted(slots, key=lambda s: (-s.stage, s.position))),
                   tuple(s for s in slots if s.takes_turns), {g: tuple(v) for g, v in lanes.items()})

    @property
    def stages(self) -> Tuple[int, ...]:
        return tuple(sorted({s.stage for s in self.slots}))

    def group_slots(self) -> Dict[str, Tuple[Slot, ...]]:
        """Each thread group's slots, in submission order."""
        return dict(self.lanes)

    # -- each thread group's order -------------------------------------------------------------------

    def walk(self, group: str, position: Position, entered: Mapping[int, T], released: Released,
             horizon: int = ALL) -> Tuple[List[Unit[T]], Position]:
        """Thread group ``group``'s next units in its order, from ``position``, as far as ``released`` allows;
        and where the walk then stands (``walk_all`` for one group)."""
        positions = {group: position}
        units = self.walk_all(positions, entered, released, horizon, (group,))[0]
        return units, positions[group]

    def walk_all(self, positions: Dict[str, Position], entered: Mapping[int, T], released: Released,
                 horizon: int = ALL, groups: Optional[Sequence[str]] = None) -> List[List[Unit[T]]]:
        """Each thread group's next units in its order, from its position in ``positions``, as far as
        ``released`` allows (``groups``: these, in this order; default every group); ``positions`` is
        moved on to where each walk then stands.

        A group's order is every period in turn and, within one, the group's slots in
        submission order. A slot whose entry has no iteration in ``entered`` (before the
        first, a gap, after the last) has no unit and is passed. A walk stops at the first
        unit the release rule holds back, or past ``horizon``, the last period any unit can
        have. This is the one sequence the engines hand out, ``check`` runs on paper and
        the simulator times.
        """
        through, decided = released
        last = through if through < horizon else horizon
        get = entered.get
        out: List[List[Unit[T]]] = []
        walks = self._lane_walks
        for group in groups if groups is not None else walks:
            slots, lowest, turns = walks[group]
            period, k = positions[group]
            # Whole periods first: every unit of a period is allowed once its newest entry (that of the
            # group's lowest stage) is decided, and, if the group takes turns, the period itself.
            whole = decided if turns else decided + lowest
            if whole >= last:
                if period == last and not k:  # the steady state: this one period, all of it, and nothing after
                    out.append([(period, slot, item) for slot in slots
                                if (item := get(period - slot.stage)) is not None])
                    positions[group] = (period + 1, 0)
                    continue
                whole = last
            units: List[Unit[T]] = []
            if period <= whole:  # the rest of this period (all of it when k is 0), then the later whole ones
                units = [(period, slot, item) for slot in slots[k:] if (item := get(period - slot.stage)) is not None]
                if period < whole:
                    units += [(p, slot, item) for p in range(period + 1, whole + 1) for slot in slots
                              if (item := get(p - slot.stage)) is not None]
                period, k = whole + 1, 0
            if period <= last:  # then slot by slot, up to the first unit held back
                period, k = self._walk_held(slots, period, k, get, decided, last, units)
            positions[group] = (period, k)
            out.append(units)
        return out

    @staticmethod
    def _walk_held(slots: Tuple[Slot, ...], period: int, k: int, get: Callable[[int], Optional[T]], decided: int,
                   last: int, units: List[Unit[T]]) -> Position:
        """``walk_all``'s slot-by-slot part, where the release rule may hold a unit back."""
        count = len(slots)
        while period <= last:
            while k < count:
                slot = slots[k]
                entry = period - slot.stage
                if entry > decided or (period > decided and slot.takes_turns):
                    return period, k
                item = get(entry)
                if item is not None:
                    units.append((period, slot, item))
                k += 1
            period, k = period + 1, 0
        return period, k

    def units(self, period: int, entered: Mapping[int, T]) -> List[Tuple[Slot, T]]:
        """Period ``period``'s units, in submission order: (slot, what entered in period ``period - stage``)."""
        return self._units_of(self.slots, period, entered)

    def turn_units(self, period: int, entered: Mapping[int, T]) -> List[Tuple[Slot, T]]:
        """Period ``period``'s units that take turns, in submission order: the order in which they are numbered
        on their turn lines (``signals.Turns`` in the engines, ``Interpreter.number`` on paper)."""
        return self._units_of(self.turn_slots, period, entered)

    @staticmethod
    def _units_of(slots: Sequence[Slot], period: int, entered: Mapping[int, T]) -> List[Tuple[Slot, T]]:
        out = []
        for slot in slots:
            item = entered.get(period - slot.stage)
            if item is not None:
                out.append((slot, item))
        return out

    def lane_units(self, group: str, start: Position, end: Position, entered: Mapping[int, T]) -> List[Unit[T]]:
        """Thread group ``group``'s units in its order from walk position ``start`` up to ``end`` (not included),
        whatever the release rule: what a walk from ``start`` that stopped at ``end`` handed out."""
        slots = self.lanes[group]
        out: List[Unit[T]] = []
        for period in range(start[0], end[0] + 1):
            first = start[1] if period == start[0] else 0
            last = end[1] if period == end[0] else len(slots)
            out.extend((period, slot, item) for slot, item in self._units_of(slots[first:last], period, entered))
        return out

    def cells(self, num_periods: int) -> List[Tuple[Slot, List[str]]]:
        """Each row's cells over the first periods (one batch entering per period): ``i{iteration}`` or ``--``."""
        entered = {period: period for period in range(num_periods)}
        cells: Dict[int, List[str]] = {slot.index: ["--"] * num_periods for slot in self.slots}
        for period in range(num_periods):
            for slot, it in self.units(period, entered):
                cells[slot.index][period] = f"i{it}"
        return [(row, cells[row.index]) for row in self.rows]

    @staticmethod
    def turn_lines(slot: Slot) -> Tuple[object, ...]:
        """The turn lines a slot's units take turns in: the sequencer, its shared stream, both or none."""
        return (("sequencer",) if slot.ordered else ()) + ((("stream", slot.stream_key),) if slot.shares_stream else ())

    def describe(self, num_periods: int) -> str:
        """The first periods as text, one line per period: each thread group's units in its order (``walk``)."""
        entered = {i: i for i in range(num_periods)}
        released: Released = (num_periods - 1, ALL)
        periods: Dict[int, Dict[str, List[Unit[int]]]] = {p: {} for p in range(num_periods)}
        for group in self.lanes:
            for unit in self.walk(group, (0, 0), entered, released)[0]:
                periods[unit[0]].setdefault(group, []).append(unit)
        lines = []
        for period, groups in periods.items():
            shown = sorted(groups.items(), key=lambda g: min(slot.position for _, slot, _ in g[1]))  # as submitted
            lines.append(f"P{period}: " + "  ".join(
                f"{g}[{' '.join(f'{slot.task}(i{it})' for _, slot, it in units)}]" for g, units in shown))
        return "\n".join(lines)
