"""The clock-driven schedule as data: which task runs on which iteration, in which order, on which thread.

One period's submission order (``Schedule.slots``) is computed once from the plan. In
period ``p`` slot ``s`` works on the iteration that entered the pipeline in period
``p - s.stage``, if one did (none did before the first batch, after the last one, and
in the periods that ``progress(None)`` ran without a batch)::

    depth 3      P0   P1   P2   P3   P4          a period's units, in slot order,
    stage 2      --   --   i0   i1   i2          go to their thread groups' FIFO
    stage 1      --   i0   i1   i2   i3          queues; globally ordered slots take
    stage 0      i0   i1   i2   i3   i4          sequencer turns in the same order

The engine hands each thread group exactly ``units(p, entered)`` of every period;
``print_schedule`` renders the same data; ``check`` runs the schedule on paper (FIFO
queues, every dependency wait, the sequencer, the clock that releases period
``depth + k`` only once iteration ``k`` retired) and raises if it could ever get stuck;
``settle`` runs the units already handed out on paper, to find what runs before more is
(the data-flow engine's step boundary).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, TypeVar

from . import ordering
from .plan import PipelinePlan

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
    inter: Tuple[int, ...]  # ... and of its inter-iteration ones (iteration i - 1)


class ScheduleError(RuntimeError):
    """The schedule would get stuck (for the clock: a bug in the ordering, never a valid plan's fault)."""

    def __init__(self, message: str, blocked: str) -> None:
        super().__init__(message)
        self.blocked = blocked  # the queue heads that could not move, in words


@dataclass(frozen=True)
class Schedule:
    depth: int
    slots: Tuple[Slot, ...]  # one period, in submission order
    rows: Tuple[Slot, ...]  # print_schedule's rows: stage-descending, in submission order within a stage
    turn_slots: Tuple[Slot, ...]  # the slots whose units take turns (globally ordered, or on a shared stream)

    @classmethod
    def build(cls, plan: PipelinePlan, stream_labels: Mapping[str, str], stream_keys: Mapping[str, object]) -> "Schedule":
        """The schedule of a validated plan; ``stream_keys`` identify streams (two labels may share a name)."""
        index = {name: k for k, name in enumerate(plan.task_names)}
        groups_on: Dict[int, Set[str]] = {}
        for name in plan.task_names:
            groups_on.setdefault(id(stream_keys[name]), set()).add(plan.schedules[name].thread_group)

        def slot(name: str, position: int) -> Slot:
            sched, key = plan.schedules[name], id(stream_keys[name])
            return Slot(name, index[name], position, sched.stage, sched.thread_group, stream_labels[name],
                        sched.globally_ordered, len(groups_on[key]) > 1, key,
                        tuple(index[d] for d in plan.intra[name]), tuple(index[d] for d in plan.inter[name]))

        order = ordering.enqueue_order(plan, stream_keys)
        slots = tuple(slot(name, k) for k, name in enumerate(order))
        # rows: stage-descending, in submission order within a stage, so that each stream's rows read
        # top to bottom in the order the stream runs them in a period
        return cls(plan.depth, slots, tuple(sorted(slots, key=lambda s: (-s.stage, s.position))),
                   tuple(s for s in slots if s.ordered or s.shares_stream))

    @property
    def stages(self) -> Tuple[int, ...]:
        return tuple(sorted({s.stage for s in self.slots}))

    def group_slots(self) -> Dict[str, Tuple[Slot, ...]]:
        """Each thread group's slots, in submission order."""
        out: Dict[str, List[Slot]] = {}
        for slot in self.slots:
            out.setdefault(slot.group, []).append(slot)
        return {group: tuple(slots) for group, slots in out.items()}

    def assign_turns(self, period: int, iteration_at: Callable[[int], Optional[int]], tasks: Sequence[Any]) -> None:
        """Number the units of ``period`` that take turns, in submission order (see ``signals.Turns``).

        ``iteration_at(entry)`` is the iteration that entered in period ``entry``, or None;
        ``tasks`` are the run's TaskRuntimes, which hold the run's turns.
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

    def busy_periods(self, first: int, last: int, entry_periods: Sequence[int]) -> List[int]:
        """The periods in ``[first, last]`` with at least one unit, given the periods iterations entered in."""
        stages = self.stages
        return sorted({e + s for e in entry_periods for s in stages if first <= e + s <= last})

    def cells(self, num_periods: int) -> List[Tuple[Slot, List[str]]]:
        """Each row's cells over the first periods (one batch entering per period): ``i{iteration}`` or ``--``."""
        return [(row, [f"i{p - row.stage}" if p >= row.stage else "--" for p in range(num_periods)])
                for row in self.rows]

    # -- proof by running it ---------------------------------------------------------------------------

    def check(self, num_batches: int, max_live: Optional[int] = None) -> None:
        """Run ``num_batches`` iterations of the schedule on paper; raise ScheduleError if it gets stuck.

        Each thread group is a FIFO of its units in (period, slot) order. A unit may run
        once it is released, its dependencies are done, and it is its turn (in the
        sequencer, and on a stream shared by thread groups: both follow the same order).
        Released means, for the clock (``max_live`` None): fill releases periods
        ``0 .. depth-1`` and retiring iteration ``k`` releases period ``depth + k``; for the
        data-flow engine: iteration ``i`` has a context (``i < retired + max_live``), and a
        unit that takes turns also needs its period known (its iterations fetched).
        Running a unit never disables another, so one maximal run decides for every timing
        whether the schedule completes.
        """
        Unit = Tuple[int, int, Slot]  # (period, iteration, slot)
        queues: Dict[str, List[Unit]] = {}
        turn_orders: Dict[object, List[Tuple[int, int]]] = {}  # the sequencer and each shared stream
        remaining = [0] * num_batches
        for period in range(num_batches + self.depth - 1):
            for slot, it in self.units(period, {i: i for i in range(num_batches)}):
                queues.setdefault(slot.group, []).append((period, it, slot))
                remaining[it] += 1
                for line in self.turn_lines(slot):
                    turn_orders.setdefault(line, []).append((slot.index, it))
        done: Set[Tuple[int, int]] = set()
        heads = {group: 0 for group in queues}
        turn = {line: 0 for line in turn_orders}
        retired = 0

        def ready(unit: Unit) -> bool:
            period, it, slot = unit
            if max_live is None:
                released = period <= self.depth - 1 + retired
            else:
                known = period < retired + max_live or retired + max_live >= num_batches
                released = it < retired + max_live and (known or not self.turn_lines(slot))
            if not released or any((d, it) not in done for d in slot.intra):
                return False
            if it > 0 and any((d, it - 1) not in done for d in slot.inter):
                return False
            return all(turn_orders[line][turn[line]] == (slot.index, it) for line in self.turn_lines(slot))

        while retired < num_batches:
            moved = False
            for group, queue in queues.items():
                while heads[group] < len(queue) and ready(queue[heads[group]]):
                    _, it, slot = queue[heads[group]]
                    done.add((slot.index, it))
                    remaining[it] -= 1
                    for line in self.turn_lines(slot):
                        turn[line] += 1
                    heads[group] += 1
                    moved = True
            while retired < num_batches and remaining[retired] == 0:
                retired, moved = retired + 1, True
            if not moved:
                blocked = "; ".join(f"thread group {g!r} waits to run {q[heads[g]][2].task} of iteration "
                                    f"{q[heads[g]][1]}" for g, q in queues.items() if heads[g] < len(q))
                raise ScheduleError(f"with {num_batches} batches the schedule gets stuck after retiring {retired} "
                                    f"iteration(s): {blocked}\n{self.describe(4)}", blocked)

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
                    if not (all(is_done(d, it) for d in slot.intra) and all(is_done(d, it - 1) for d in slot.inter)
                            and my_turn(slot, it)):
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
        """The first periods as text, one line per period: each thread group's units in order."""
        lines = []
        for period in range(num_periods):
            per_group: Dict[str, List[str]] = {}
            for slot, it in self.units(period, {i: i for i in range(num_periods)}):
                per_group.setdefault(slot.group, []).append(f"{slot.task}(i{it})")
            lines.append(f"P{period}: " + "  ".join(f"{g}[{' '.join(u)}]" for g, u in per_group.items()))
        return "\n".join(lines)
