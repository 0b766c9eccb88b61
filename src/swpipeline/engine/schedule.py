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
sequence, as far as their release rule (``release.py``) allows; ``check`` runs it on
paper under the same rule (FIFO queues, every dependency wait, the turns, the caller's
own group) and raises if it could ever get stuck (``stuck.py`` says why, in words); the
simulator times it; ``print_schedule`` renders the same slots; ``settle`` runs the units
already handed out on paper, to find what runs before more is (the step boundary).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, TypeVar

from ..plan import ordering
from ..plan.model import IterContext, PipelinePlan
from .release import ALL, Entries, Released, ReleaseRule
from .stuck import Standstill, blocked

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


# One task on one iteration, as a thread group's order lists it: ``(period, slot, item)``, ``item`` being
# what entered in period ``period - slot.stage`` (an IterContext in the engines, an iteration on paper).
# A plain tuple, unpacked by name where it is read: a named tuple would cost 0.12 us more per unit, a
# seventh of the engine's whole cost per task.
Unit = Tuple[int, Slot, T]
Work = Unit[IterContext]  # a unit as a worker runs it
Position = Tuple[int, int]  # where a thread group's walk stands: (period, index into the group's slots)
WHOLE_PERIOD = 1 << 30  # a submission position past every slot's: "all of the period" (see runs_before_retire)


class ScheduleError(RuntimeError):
    """The schedule would get stuck (for the clock: a bug in the ordering, never a valid plan's fault)."""

    def __init__(self, message: str, blocked: str) -> None:
        super().__init__(message)
        self.blocked = blocked  # each thread group's unit that could not move and what it waits for, in words


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

    def assign_turns(self, period: int, iteration_at: Callable[[int], Optional[int]], tasks: Sequence[Any]) -> None:
        """Number the units of ``period`` that take turns, in submission order (see ``signals.Turns``).

        ``iteration_at(entry)`` is the iteration that entered in period ``entry``, or None;
        ``tasks`` are the run's BoundTasks, which hold the run's turns.
        """
        for slot in self.turn_slots:
            it = iteration_at(period - slot.stage)
            if it is None:
                continue
            task, key, label = tasks[slot.index], (slot.index, it), f"{slot.task}(i{it})"
            if task.stream_turns is not None:
                task.stream_turns.assign(key, label)
            if task.turns is not None:
                task.turns.assign(key, label)

    def units(self, period: int, entered: Mapping[int, T]) -> List[Tuple[Slot, T]]:
        """Period ``period``'s units, in submission order: (slot, what entered in period ``period - stage``)."""
        out = []
        for slot in self.slots:
            item = entered.get(period - slot.stage)
            if item is not None:
                out.append((slot, item))
        return out

    def cells(self, num_periods: int) -> List[Tuple[Slot, List[str]]]:
        """Each row's cells over the first periods (one batch entering per period): ``i{iteration}`` or ``--``."""
        return [(row, [f"i{p - row.stage}" if p >= row.stage else "--" for p in range(num_periods)])
                for row in self.rows]

    # -- proof by running it ---------------------------------------------------------------------------

    def check(self, rule: ReleaseRule, num_batches: int, caller_group: Optional[str] = None) -> None:
        """Run ``num_batches`` iterations of the schedule on paper under ``rule``; raise ScheduleError if it gets
        stuck.

        The caller fills, then repeatedly runs its own group's units (``caller_group``: only
        those one ``progress()`` call runs, ``runs_before_retire``), retires the oldest iteration once
        all its units are done, and hands out what the rule then releases, exactly as the
        engines do. Each other thread group is a FIFO of the units handed to it. A unit may
        run once its dependencies are done and it is its turn (in the sequencer, and on a
        stream shared by thread groups; turns are numbered period by period as periods are
        decided). Running a unit never disables another, so one maximal run decides for
        every timing whether the schedule completes.
        """
        entries: Entries[int] = Entries()
        created = [0]

        def fetch() -> Optional[int]:
            if created[0] >= num_batches:
                return None
            created[0] += 1
            return created[0] - 1

        queues: Dict[str, List[Unit[int]]] = {g: [] for g in self.lanes}
        positions: Dict[str, Position] = {g: (0, 0) for g in self.lanes}
        turn_orders: Dict[object, List[Tuple[int, int]]] = {}
        numbered = [0]  # periods whose turns are numbered

        def hand_out() -> None:
            released = rule.released(entries)
            horizon = entries.horizon(self.depth)
            through = min(*released, horizon)  # (through_period, decided)
            while numbered[0] <= through:
                for slot in self.turn_slots:
                    it = entries.entered.get(numbered[0] - slot.stage)
                    if it is not None:
                        for line in self.turn_lines(slot):
                            turn_orders.setdefault(line, []).append((slot.index, it))
                numbered[0] += 1
            for group, units in zip(self.lanes, self.walk_all(positions, entries.entered, released, horizon)):
                queues[group].extend(units)

        remaining = [len(self.slots)] * num_batches
        done: Set[Tuple[int, int]] = set()
        heads = {group: 0 for group in queues}
        turn = {line: 0 for line in turn_orders}
        rule.fill(entries, fetch)
        hand_out()
        retired = 0

        def ready(unit: Unit[int]) -> bool:
            _, slot, it = unit
            if any((d, it) not in done for d in slot.intra):
                return False
            if any(it >= back and (d, it - back) not in done for d, back in slot.inter):
                return False
            for line in self.turn_lines(slot):
                order, k = turn_orders.get(line, ()), turn.get(line, 0)
                if k >= len(order) or order[k] != (slot.index, it):
                    return False
            return True

        while retired < num_batches:
            moved = False
            caller_through = rule.caller_through(entries)
            for group, queue in queues.items():
                while heads[group] < len(queue) and ready(queue[heads[group]]):
                    period, slot, it = queue[heads[group]]
                    if group == caller_group and not self.runs_before_retire(period, slot, caller_through):
                        break  # the caller runs these in a later progress() call
                    done.add((slot.index, it))
                    remaining[it] -= 1
                    for line in self.turn_lines(slot):
                        turn[line] = turn.get(line, 0) + 1
                    heads[group] += 1
                    moved = True
            caller_busy = caller_group is not None and heads[caller_group] < len(queues[caller_group]) and \
                self.runs_before_retire(*queues[caller_group][heads[caller_group]][:2], caller_through)
            if remaining[retired] == 0 and not caller_busy:  # progress() runs its units first, then retires
                entries.retire(retired)
                retired += 1
                rule.after_retire(entries, fetch)
                hand_out()
                moved = True
            if not moved:
                why = blocked(self, Standstill(queues, heads, positions, done, turn_orders, turn,
                                               rule.released(entries), entries.horizon(self.depth), caller_group,
                                               caller_through))
                raise ScheduleError(f"with {num_batches} batches the schedule gets stuck after retiring {retired} "
                                    f"iteration(s): {why or 'nothing is handed out'}\n{self.describe(4)}", why)

    def settle(self, queues: Mapping[str, Sequence[Tuple[int, Slot]]],
               turn_orders: Mapping[object, Sequence[Tuple[int, int]]], retired: int) -> Dict[int, int]:
        """What runs, on paper, of units already handed out if nothing more is: per task index, the last
        iteration of it that does (a task absent: none).

        ``queues``: each thread group's units not yet retired, ``(iteration, slot)`` in its order;
        ``turn_orders``: each turn line's numbered units ``(task index, iteration)`` in number order
        (a unit numbered but not handed out blocks its line); every unit of an iteration below
        ``retired`` is done. As in ``check``, running a unit never disables another, so one
        maximal run gives the answer whatever the timing.
        """
        done: Set[Tuple[int, int]] = set()
        at = {line: 0 for line in turn_orders}

        def is_done(index: int, it: int) -> bool:
            return it < retired or (index, it) in done

        def my_turn(slot: Slot, it: int) -> bool:
            for line in self.turn_lines(slot):
                order = turn_orders.get(line, ())
                k = at.get(line, 0)
                while k < len(order) and is_done(*order[k]):
                    k += 1
                at[line] = k
                if k == len(order) or order[k] != (slot.index, it):
                    return False
            return True

        heads = {group: 0 for group in queues}
        moved = True
        while moved:
            moved = False
            for group, queue in queues.items():
                while heads[group] < len(queue):
                    it, slot = queue[heads[group]]
                    if not (all(is_done(d, it) for d in slot.intra)
                            and all(is_done(d, it - back) for d, back in slot.inter) and my_turn(slot, it)):
                        break
                    done.add((slot.index, it))
                    heads[group] += 1
                    moved = True
        last: Dict[int, int] = {}
        for index, it in done:
            last[index] = max(it, last.get(index, it))
        return last

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
