"""Schedules run on paper, without threads or times: the deadlock check and the step boundary.

``check`` runs a number of batches through a schedule under an engine's release rule
(``release.py``) exactly as the engines hand out work, and raises ``ScheduleError`` if it
could ever get stuck; ``check_together`` does the same for several schedules at once (one
per rank) whose units wait on each other. ``boundary`` finds what runs of units already
handed out if nothing more is (the step boundary). All three drive the one interpreter of
the schedule's units (``interpreter.py``); each engine on paper does what the engine does::

    fill          rule.fill_step: draw the first batches (iteration i enters in period i)
    hand out      number the turns of every period decided; walk each group's order as far as the
                  rule released it and append it to the group's lane
    run           the interpreter runs every unit that can; the caller's group only what one
                  progress() call runs (Schedule.runs_before_retire, up to rule.caller_through)
    retire        the oldest iteration once all its units ran and the caller has nothing left
                  before retiring; then rule.retired draws what comes next, and hand out

Nothing else moves a paper run, and running a unit never disables another, so one
maximal run decides for every timing whether the schedules complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..devices.device import CPUDevice
from ..plan import ordering
from ..plan.model import PipelinePlan
from .interpreter import Interpreter, Lane, UnitRef
from .release import Entries, Fetch, ReleaseRule
from .runtime import build_tasks
from .schedule import Position, Schedule, Unit
from .stuck import Standstill, blocked

__all__: List[str] = []

Ran = Callable[[UnitRef, Tuple[UnitRef, ...]], None]  # told of each unit run on paper, and of what it waited for


class ScheduleError(RuntimeError):
    """The schedule would get stuck (for the clock: a bug in the ordering, never a valid plan's fault)."""

    def __init__(self, message: str, blocked: str) -> None:
        super().__init__(message)
        self.blocked = blocked  # each thread group's unit that could not move and what it waits for, in words


def schedule_of(plan: PipelinePlan) -> Schedule:
    """The schedule the engines build for ``plan``, its streams told apart as on the CPU (a name each).

    Raises:
        ValueError: the plan breaks a stage rule.
    """
    ordering.validate_stages(plan)
    tasks = build_tasks(plan, CPUDevice())
    return Schedule.build(plan, {t.name: t.stream_label for t in tasks}, {t.name: t.stream for t in tasks})


@dataclass(frozen=True)
class OnPaper:
    """One schedule as its engine runs it: the release rule, the group the caller runs, a name for the words."""

    schedule: Schedule
    rule: ReleaseRule
    caller_group: Optional[str] = None
    name: str = ""


def check(schedule: Schedule, rule: ReleaseRule, num_batches: int, caller_group: Optional[str] = None) -> None:
    """Run ``num_batches`` iterations of ``schedule`` on paper under ``rule``; raise ScheduleError if it gets stuck.

    ``caller_group``: a thread group run by the caller, only inside ``progress()``.
    """
    check_together([OnPaper(schedule, rule, caller_group)], num_batches)


def check_together(engines: Sequence[OnPaper], num_batches: int, cross: Iterable[Tuple[UnitRef, UnitRef]] = (),
                   together: Iterable[Tuple[UnitRef, UnitRef]] = (), ran: Optional[Ran] = None) -> None:
    """Run ``num_batches`` iterations of every schedule on paper at once; raise ScheduleError if they get stuck.

    Units are named ``(index into engines, task name, iteration)``; ``cross``: ``(waiter, waited_for)``;
    ``together``: pairs that run at the same moment (see ``Interpreter``). ``ran``, if given, is told of
    each unit as it runs on paper, with the units it waited for (``Interpreter.waited_for``), so a caller
    can put times on the run: a unit starts once the last of those has ended.
    """
    PaperRun(engines, num_batches, cross, together).run(ran)


class PaperEngine:
    """One engine's hand-out on paper: ``handout.HandOut`` without threads, feeding the interpreter's lanes.

    It keeps the engine's entries (which iteration entered in which period), each group's
    walk, the periods whose turns are numbered, and the iterations retired. ``fetch`` draws
    the next iteration (None: there is none); the simulator passes one that also takes time.
    """

    def __init__(self, k: int, spec: OnPaper, interpreter: Interpreter, fetch: Fetch[int]) -> None:
        self.k, self.schedule, self.rule, self.interpreter = k, spec.schedule, spec.rule, interpreter
        self.fetch = fetch
        self.entries: Entries[int] = Entries()
        self.positions: Dict[str, Position] = {group: (0, 0) for group in self.schedule.lanes}
        self.lanes = [interpreter.lane_of[(k, group)] for group in self.schedule.lanes]
        self.numbered = 0  # periods whose turns are numbered
        self.fill_steps_done = 0
        self.retired = 0
        self.caller_group = spec.caller_group
        self.caller_lane = None if spec.caller_group is None else interpreter.lane_of[(k, spec.caller_group)]
        self.caller_through = 0

    def step(self) -> Tuple[range, List[int]]:
        """One hand-out, as the engine makes them: a step of the fill while it lasts, else what follows a
        retirement (a clock tick, a data-flow top-up). Returns the periods whose turns it numbered, and how
        many units it handed to each of the schedule's lanes (in ``Schedule.lanes`` order)."""
        rule, entries = self.rule, self.entries
        if self.fill_steps_done < rule.fill_steps:
            rule.fill_step(entries, self.fetch)
            self.fill_steps_done += 1
            released = rule.released(entries)
        else:
            released = rule.retired(entries, None, self.fetch)  # the oldest retired already (retire)
        horizon = entries.horizon(self.schedule.depth)
        through, first = min(*released, horizon), self.numbered  # (through_period, decided)
        interpreter = self.interpreter
        while self.numbered <= through:
            interpreter.number(self.k, self.numbered, entries.entered)
            self.numbered += 1
        walked = self.schedule.walk_all(self.positions, entries.entered, released, horizon)
        for lane, units in zip(self.lanes, walked):
            interpreter.hand_out(lane, units)
        return range(first, self.numbered), [len(units) for units in walked]

    def retire(self) -> None:
        """The oldest iteration retires (the caller's; its next hand-out follows with ``step``)."""
        self.entries.retire(self.retired)
        self.retired += 1

    def caller_runs(self, head: Unit[int]) -> bool:
        """Whether the caller's group runs ``head`` before this progress() call retires the oldest iteration."""
        return self.schedule.runs_before_retire(head[0], head[1], self.caller_through)

    def may_retire(self, num_batches: int) -> bool:
        """Whether the oldest iteration retires now: all its units ran, and the caller runs nothing more first."""
        if self.retired >= num_batches or not self.interpreter.iteration_done(self.k, self.retired):
            return False
        if self.caller_lane is not None:
            head = self.interpreter.head(self.caller_lane)
            if head is not None and self.caller_runs(head):  # progress() runs its units first, then retires
                return False
        return True

    def standstill(self) -> Standstill:
        return Standstill(self.k, self.positions, self.rule.released(self.entries),
                          self.entries.horizon(self.schedule.depth), self.caller_group, self.caller_through)


def _counter(num_batches: int) -> Fetch[int]:
    """Draws iterations 0, 1, ... up to ``num_batches`` (None after)."""
    drawn = iter(range(num_batches))
    return lambda: next(drawn, None)


class PaperRun:
    """Several engines on paper, each with its schedule and rule, their units interpreted together."""

    def __init__(self, engines: Sequence[OnPaper], num_batches: int, cross: Iterable[Tuple[UnitRef, UnitRef]] = (),
                 together: Iterable[Tuple[UnitRef, UnitRef]] = ()) -> None:
        names = [spec.name or f"schedule {k}" for k, spec in enumerate(engines)]
        self.interpreter = Interpreter([spec.schedule for spec in engines], cross, together, names)
        self.engines = [PaperEngine(k, spec, self.interpreter, _counter(num_batches))
                        for k, spec in enumerate(engines)]
        self.num_batches = num_batches
        self._by_lane = {lane: self.engines[k] for lane, k in enumerate(self.interpreter.lane_schedule)}

    def _may_run(self, lane: Lane, head: Unit[int]) -> bool:
        engine = self._by_lane[lane]
        return lane != engine.caller_lane or engine.caller_runs(head)

    def run(self, ran: Optional[Ran] = None) -> None:
        """Fill every engine, then run, retire and hand out until every batch retired; ScheduleError if stuck.
        ``ran``: see ``check_together``."""
        for engine in self.engines:
            for _ in range(engine.rule.fill_steps):
                engine.step()
        ref = self.interpreter.ref
        told = None if ran is None else (lambda key, after: ran(ref(key), tuple(map(ref, after))))
        while any(engine.retired < self.num_batches for engine in self.engines):
            for engine in self.engines:
                engine.caller_through = engine.rule.caller_through(engine.entries)
            moved = self.interpreter.run(self._may_run, told) > 0
            for engine in self.engines:
                if engine.may_retire(self.num_batches):
                    engine.retire()
                    engine.step()
                    moved = True
            if not moved:
                raise self._stuck()

    def _stuck(self) -> ScheduleError:
        why = blocked(self.interpreter, [engine.standstill() for engine in self.engines])
        if len(self.engines) == 1:
            engine = self.engines[0]
            return ScheduleError(f"with {self.num_batches} batches the schedule gets stuck after retiring "
                                 f"{engine.retired} iteration(s): {why or 'nothing is handed out'}\n"
                                 f"{engine.schedule.describe(4)}", why)
        names = self.interpreter.names
        retired = ", ".join(f"{engine.retired} on {names[engine.k]}" for engine in self.engines)
        shown = "\n".join(f"{names[engine.k]}:\n{engine.schedule.describe(4)}" for engine in self.engines)
        return ScheduleError(f"with {self.num_batches} batches the schedules get stuck after retiring {retired} "
                             f"iteration(s): {why or 'nothing is handed out'}\n{shown}", why)


def boundary(schedule: Schedule, handed: Mapping[str, Sequence[Unit[int]]], entered: Mapping[int, int],
           numbered: range, retired: int) -> Dict[int, int]:
    """What runs, on paper, of units already handed out if nothing more is: per task index, the last iteration of it
    that does (a task absent: none).

    ``handed``: each thread group's units not retired, in its order; ``entered``: period -> the
    iteration that entered in it (live ones); ``numbered``: the periods whose turns are numbered (a
    unit numbered but not handed out blocks its line); every unit of an iteration below ``retired``
    is done. One maximal run gives the answer whatever the timing (see ``interpreter.py``).
    """
    interpreter = Interpreter([schedule])
    interpreter.floor = interpreter.key(0, 0, retired)
    for group, units in handed.items():
        interpreter.hand_out(interpreter.lane_of[(0, group)], units)
    for period in numbered:
        interpreter.number(0, period, entered)
    interpreter.run()
    last: Dict[int, int] = {}
    for key in interpreter.done:
        it, index = divmod(key, interpreter.width)
        last[index] = max(it, last.get(index, it))
    return last
