"""The one interpreter of the schedule's units: when a unit handed out may run, whose turn it is, when an
iteration is done. Every run of a schedule on paper drives it; a rule about when a unit runs is written here
and nowhere else.

Its drivers: the deadlock check (``paper.check``, ``paper.check_together``), the step boundary
(``paper.boundary``) and the simulator (``tuning/sim_core.py``, which puts times on top: a unit that
may run starts at the latest end of what it waited for). ``swpipeline.pp`` proves every rank's plan of a
pipeline split across processes with ``check_together`` and times them from what ``run`` tells it
(``ran``: each unit as it runs, and what it waited for). The engines themselves run the same rule with
threads: a dependency is a completion signal, a turn a ``signals.Turns``, a lane a worker's FIFO queue.

::

    lane            one thread group of one schedule: the units handed to it (hand_out), run in that
                    order; the first not run is its head
    a unit runs     when it is its lane's head and
    (can_run)         - every dependency is done: intra (its own iteration), inter at distance d
                        (iteration i - d; none before iteration 0), cross (units of other schedules);
                      - on each of its turn lines (the sequencer of globally ordered tasks, a stream
                        shared by thread groups) it is the next unit numbered: its period's turns are
                        numbered (number) and every unit numbered before it has run;
                      - with a partner (together): the partner is its own lane's head and can run but
                        for this unit; the two run at once (a blocking send and its receive)
    an iteration    of a schedule is done once every one of its units has run (iteration_done);
                    iterations below ``floor`` count as done (the boundary: retired already)

Running a unit never keeps another from running: each condition above, once true, stays
true. So running every unit that can, in any order, until none can (``run``) always ends
in the same state, whatever the timing; a unit still not run then never runs. That is
why one paper run decides for every timing whether a schedule completes.

**Several schedules.** One schedule per rank of a pipeline split across processes is
interpreted together: ``Interpreter([s0, s1], cross=[((1, "RecvF", 3), (0, "SendF", 3))])``.
Each schedule keeps its own lanes and turn lines (a rank's sequencer and streams are its
own); ``cross`` adds waits between units of different schedules, ``together`` pairs of units
that can only run at the same moment. A unit is named ``(schedule index, task name,
iteration)`` outside (``UnitRef``) and by one int inside, its *key*::

    key = iteration * width + base[schedule] + task index      width: every schedule's tasks

so keys of one iteration sort before the next one's, and the simulator indexes its arrays by them.
"""

from __future__ import annotations

import bisect
from typing import Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple

from .schedule import Schedule, Unit

__all__: List[str] = []

UnitRef = Tuple[int, str, int]  # a unit outside the interpreter: (schedule index, task name, iteration)
Lane = int  # a lane's index: the schedules' thread groups, schedule by schedule, each in first-use order
MayRun = Callable[[Lane, Unit[int]], bool]  # a driver's own limit on a lane's head (the caller's group)
Ran = Callable[[int, Tuple[int, ...]], None]  # told of each unit run: its key and the keys it waited for (waited_for)


class Wait(NamedTuple):
    """What a lane's head waits for (``Interpreter.blocker``).

    ``kind``: ``"dependency"`` (the unit ``schedule``/``task``/``iteration`` is not done), ``"turn"``
    (that unit goes first on ``line``), ``"not numbered"`` (the turns of the head's period on ``line``
    are not numbered yet; the unit named is the head itself), ``"partner"`` (the unit it must run
    together with is not its lane's head, or cannot run yet).
    """

    kind: str
    schedule: int
    task: str
    iteration: int
    line: object = None  # a turn line, as ``Schedule.turn_lines`` names it (kinds "turn", "not numbered")


class Interpreter:
    """Units of one or more schedules handed out, run on paper (see the module docstring).

    Args:
        schedules: the schedules, each with its own lanes and turn lines.
        cross: ``(waiter, waited_for)`` pairs of units: ``waiter`` runs only once ``waited_for`` is done.
        together: ``(a, b)`` pairs of units (of different lanes) that run at the same moment.
        names: a name per schedule for the words of ``stuck.py`` (default: ``schedule 0``, ...).

    Raises:
        ValueError: a unit of ``cross`` or ``together`` names no task of its schedule, a negative
            iteration, or a unit paired twice.
    """

    def __init__(self, schedules: Sequence[Schedule], cross: Iterable[Tuple[UnitRef, UnitRef]] = (),
                 together: Iterable[Tuple[UnitRef, UnitRef]] = (), names: Optional[Sequence[str]] = None) -> None:
        self.schedules = tuple(schedules)
        self.names = tuple(names) if names is not None else tuple(f"schedule {k}" for k in range(len(schedules)))
        self.bases: List[int] = []
        width = 0
        for schedule in self.schedules:
            self.bases.append(width)
            width += len(schedule.slots)
        self.width = width
        self.count, self.sizes = len(self.schedules), [len(s.slots) for s in self.schedules]  # schedules, their tasks
        self.task_names = [slot.task for schedule in self.schedules
                           for slot in sorted(schedule.slots, key=lambda s: s.index)]
        self.lane_of: Dict[Tuple[int, str], Lane] = {}
        self.lane_schedule: List[int] = []
        for k, schedule in enumerate(self.schedules):
            for group in schedule.lanes:
                self.lane_of[(k, group)] = len(self.lane_schedule)
                self.lane_schedule.append(k)
        self.lanes: List[List[Unit[int]]] = [[] for _ in self.lane_schedule]  # the units handed out, per lane
        self.heads: List[int] = [0] * len(self.lanes)  # each lane's first unit not run
        # per schedule, per task index: its dependencies as (key offset, distance), and its turn lines
        self.deps: List[List[Tuple[Tuple[int, int], ...]]] = []
        self.lines_of: List[List[Tuple[int, ...]]] = []
        self.lines: List[Tuple[int, object]] = []  # each turn line: (schedule, its name in Schedule.turn_lines)
        for k, schedule in enumerate(self.schedules):
            self._compile(k, schedule)
        self.orders: List[List[int]] = [[] for _ in self.lines]  # each line's units, in turn order (keys)
        self.turns: List[int] = [0] * len(self.lines)  # each line's turns taken
        self.done: Set[int] = set()
        self.floor = 0  # every key below it is done (iterations retired before the paper run began)
        self.left: Dict[int, int] = {}  # iteration * schedules + schedule -> its units not run, once one ran
        self.cross: Dict[int, Tuple[int, ...]] = {}
        for waiter, waited in cross:
            key = self.key_of(waiter)
            self.cross[key] = self.cross.get(key, ()) + (self.key_of(waited),)
        self.partner: Dict[int, int] = {}
        for a, b in together:
            ka, kb = self.key_of(a), self.key_of(b)
            if ka in self.partner or kb in self.partner or ka == kb:
                raise ValueError(f"together: {a} and {b}: a unit runs together with one other unit at most; "
                                 f"pair each unit once")
            self.partner[ka], self.partner[kb] = kb, ka

    def _compile(self, k: int, schedule: Schedule) -> None:
        """Schedule ``k``'s dependencies as key offsets, and its turn lines as line indices."""
        width, base = self.width, self.bases[k]
        slots = sorted(schedule.slots, key=lambda s: s.index)
        line_ids: Dict[object, int] = {}
        deps, lines_of = [], []
        for slot in slots:
            here = base + slot.index
            deps.append(tuple((base + d - here, 0) for d in slot.intra)
                        + tuple((base + d - here - back * width, back) for d, back in slot.inter))
            ids = []
            for line in schedule.turn_lines(slot):
                if line not in line_ids:
                    line_ids[line] = len(self.lines)
                    self.lines.append((k, line))
                ids.append(line_ids[line])
            lines_of.append(tuple(ids))
        self.deps.append(deps)
        self.lines_of.append(lines_of)

    # -- naming units -------------------------------------------------------------------------------

    def key(self, schedule: int, index: int, iteration: int) -> int:
        """The key of task ``index`` of ``schedule`` on ``iteration``."""
        return iteration * self.width + self.bases[schedule] + index

    def key_of(self, unit: UnitRef) -> int:
        schedule, task, iteration = unit
        if not 0 <= schedule < len(self.schedules):
            raise ValueError(f"unit {unit}: there is no schedule {schedule} (there are {len(self.schedules)})")
        slots = {slot.task: slot.index for slot in self.schedules[schedule].slots}
        if task not in slots:
            raise ValueError(f"unit {unit}: {self.names[schedule]} has no task {task!r} (its tasks: {list(slots)})")
        if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
            raise ValueError(f"unit {unit}: the iteration must be an int >= 0, got {iteration!r}")
        return self.key(schedule, slots[task], iteration)

    def ref(self, key: int) -> UnitRef:
        """The unit of ``key``: (schedule index, task name, iteration)."""
        iteration, rest = divmod(key, self.width)
        return bisect.bisect_right(self.bases, rest) - 1, self.task_names[rest], iteration

    # -- what the drivers feed in ---------------------------------------------------------------------

    def hand_out(self, lane: Lane, units: Sequence[Unit[int]]) -> None:
        """Append ``units`` (``(period, slot, iteration)``, in the lane's order) to ``lane``."""
        self.lanes[lane].extend(units)

    def number(self, schedule: int, period: int, entered: Mapping[int, int]) -> None:
        """Number the turns of ``period`` of ``schedule``: its units that take turns, in submission order, join
        their lines (``entered``: period -> the iteration that entered in it)."""
        lines_of, orders, base, width = self.lines_of[schedule], self.orders, self.bases[schedule], self.width
        for slot, iteration in self.schedules[schedule].turn_units(period, entered):
            for line in lines_of[slot.index]:
                orders[line].append(iteration * width + base + slot.index)

    # -- running -------------------------------------------------------------------------------------

    def head(self, lane: Lane) -> Optional[Unit[int]]:
        """The lane's first unit not run (None: every unit handed to it has run)."""
        h, units = self.heads[lane], self.lanes[lane]
        return units[h] if h < len(units) else None

    def can_run(self, lane: Lane) -> bool:
        """Whether the lane's head may run now (see the module docstring)."""
        h, units = self.heads[lane], self.lanes[lane]
        if h >= len(units):
            return False
        _, slot, iteration = units[h]
        schedule = self.lane_schedule[lane]
        key = iteration * self.width + self.bases[schedule] + slot.index
        if not self.waits_met(schedule, slot.index, iteration, key):
            return False
        return not self.partner or self._partner_ready(key)

    def waits_met(self, schedule: int, index: int, iteration: int, key: int) -> bool:
        """Whether a unit's waits are met, but for its lane and a partner: its dependencies, cross waits, turns (the
        unit ``key``: task ``index`` of ``schedule`` on ``iteration``). ``can_run`` asks it of a lane's head; the
        simulator, which knows its heads, asks it directly."""
        done, floor = self.done, self.floor
        for offset, back in self.deps[schedule][index]:
            if iteration >= back:
                dep = key + offset
                if dep >= floor and dep not in done:
                    return False
        if self.cross:
            for dep in self.cross.get(key, ()):
                if dep >= floor and dep not in done:
                    return False
        orders, turns = self.orders, self.turns
        for line in self.lines_of[schedule][index]:
            order, taken = orders[line], turns[line]
            if taken >= len(order) or order[taken] != key:
                return False
        return True

    def _partner_ready(self, key: int) -> bool:
        """A unit without a partner, or whose partner is done or is its lane's head and free but for it."""
        other = self.partner.get(key)
        if other is None or other in self.done or other < self.floor:
            return True
        lane = self._lane_with_head(other)
        if lane is None:
            return False
        schedule, _, iteration = self.ref(other)
        return self.waits_met(schedule, other - iteration * self.width - self.bases[schedule], iteration, other)

    def _lane_with_head(self, key: int) -> Optional[Lane]:
        """The lane whose head is the unit ``key``, if any."""
        schedule, _, iteration = self.ref(key)
        index = key - iteration * self.width - self.bases[schedule]
        slot = next(s for s in self.schedules[schedule].slots if s.index == index)
        lane = self.lane_of[(schedule, slot.group)]
        head = self.head(lane)
        return lane if head is not None and head[1] is slot and head[2] == iteration else None

    def run_head(self, lane: Lane) -> int:
        """Run the lane's head (``can_run`` said it may), and its partner if it has one; returns the head's key."""
        _, slot, iteration = self.lanes[lane][self.heads[lane]]
        schedule, index = self.lane_schedule[lane], slot.index
        key = iteration * self.width + self.bases[schedule] + index
        self._complete(lane, schedule, index, iteration, key)
        if self.partner:
            other = self.partner.get(key)
            if other is not None and other not in self.done and other >= self.floor:
                other_lane = self._lane_with_head(other)
                assert other_lane is not None  # (can_run checked it)
                _, other_slot, other_iteration = self.lanes[other_lane][self.heads[other_lane]]
                other_schedule = self.lane_schedule[other_lane]
                self._complete(other_lane, other_schedule, other_slot.index, other_iteration, other)
        return key

    def _complete(self, lane: Lane, schedule: int, index: int, iteration: int, key: int) -> None:
        self.done.add(key)
        self.heads[lane] += 1
        lines = self.lines_of[schedule][index]
        if lines:
            turns = self.turns
            for line in lines:
                turns[line] += 1
        counted, left = iteration * self.count + schedule, self.left
        left[counted] = left.get(counted, self.sizes[schedule]) - 1

    def run(self, may_run: Optional[MayRun] = None, ran: Optional[Ran] = None) -> int:
        """Run every unit that can run (and that ``may_run`` allows, if given), until none can; returns how
        many ran (a pair counts twice). The state reached is the same in whatever order they run (see the
        module docstring). ``ran``, if given, is told of each unit as it runs, with what it waited for
        (``waited_for``): enough to put times on a paper run without restating when a unit may run."""
        before, moved = len(self.done), True
        while moved:
            moved = False
            for lane in range(len(self.lanes)):
                while self.can_run(lane):
                    if may_run is not None:
                        head = self.lanes[lane][self.heads[lane]]
                        if not may_run(lane, head) or not self._partner_allowed(head, lane, may_run):
                            break
                    if ran is None:
                        self.run_head(lane)
                    else:
                        self._run_reported(lane, ran)
                    moved = True
        return len(self.done) - before

    def waited_for(self, lane: Lane) -> Tuple[int, ...]:
        """The keys of what the lane's head waits for, each once, in this order: its dependencies, its cross waits,
        the unit before it in its lane, the unit before it on each of its turn lines (none below ``floor``). Once
        the head can run they are all done: on paper it starts once the last of them has ended."""
        h, units = self.heads[lane], self.lanes[lane]
        _, slot, iteration = units[h]
        schedule = self.lane_schedule[lane]
        key = self.key(schedule, slot.index, iteration)
        found = [key + offset for offset, back in self.deps[schedule][slot.index] if iteration >= back]
        found += self.cross.get(key, ())
        if h:
            found.append(self.key(schedule, units[h - 1][1].index, units[h - 1][2]))
        for line in self.lines_of[schedule][slot.index]:
            if self.turns[line]:
                found.append(self.orders[line][self.turns[line] - 1])
        return tuple(k for k in dict.fromkeys(found) if k >= self.floor)

    def _run_reported(self, lane: Lane, ran: Ran) -> None:
        """``run_head``, telling ``ran`` of the head and of its partner, if one runs with it: a pair starts once both
        may, so each is told of what either waited for."""
        after = self.waited_for(lane)
        _, slot, iteration = self.lanes[lane][self.heads[lane]]
        key = self.key(self.lane_schedule[lane], slot.index, iteration)
        other = self.partner.get(key)
        other_lane = None if other is None or self._key_done(other) else self._lane_with_head(other)
        if other_lane is not None:
            after = tuple(dict.fromkeys(after + self.waited_for(other_lane)))
        self.run_head(lane)
        for unit in (key,) if other is None or other_lane is None else (key, other):
            ran(unit, after)

    def _partner_allowed(self, head: Unit[int], lane: Lane, may_run: MayRun) -> bool:
        if not self.partner:
            return True
        schedule = self.lane_schedule[lane]
        other = self.partner.get(self.key(schedule, head[1].index, head[2]))
        other_lane = None if other is None else self._lane_with_head(other)
        return other_lane is None or may_run(other_lane, self.lanes[other_lane][self.heads[other_lane]])

    # -- reading the state ----------------------------------------------------------------------------

    def is_done(self, schedule: int, index: int, iteration: int) -> bool:
        key = self.key(schedule, index, iteration)
        return key < self.floor or key in self.done

    def iteration_done(self, schedule: int, iteration: int) -> bool:
        """Whether every unit of ``iteration`` of ``schedule`` has run."""
        return self.left.get(iteration * self.count + schedule) == 0

    def blocker(self, lane: Lane) -> Optional[Wait]:
        """What the lane's head waits for, the first wait of the module docstring's list not met (None: it has
        none, or the lane has no unit left)."""
        head = self.head(lane)
        if head is None:
            return None
        _, slot, iteration = head
        schedule = self.lane_schedule[lane]
        key = self.key(schedule, slot.index, iteration)
        for offset, back in self.deps[schedule][slot.index]:
            if iteration >= back and not self._key_done(key + offset):
                return Wait("dependency", *self.ref(key + offset))
        for dep in self.cross.get(key, ()):
            if not self._key_done(dep):
                return Wait("dependency", *self.ref(dep))
        for line in self.lines_of[schedule][slot.index]:
            order, taken = self.orders[line], self.turns[line]
            name = self.lines[line][1]
            if taken >= len(order):
                return Wait("not numbered", schedule, slot.task, iteration, name)
            if order[taken] != key:
                return Wait("turn", *self.ref(order[taken]), name)
        if not self._partner_ready(key):
            return Wait("partner", *self.ref(self.partner[key]))
        return None

    def _key_done(self, key: int) -> bool:
        return key < self.floor or key in self.done
