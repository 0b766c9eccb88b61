"""Handing out work: each thread group's units, drawn batches and the release rule, for one run.

Both engines use this one policy; they differ only in their release rule
(``release.ClockRule``, ``release.DataFlowRule``). Per run it keeps which iteration
entered in which period (``release.Entries``) and, per thread group, how far along the
group's order (``Schedule.walk``) it has handed out::

    fill / resume     rule.fill_step: draw, then hand out, once per step of the fill
    progress()        [the caller's group runs its units (run_caller_units): up to rule.caller_through,
                       the oldest iteration's last period, and in it up to its last units]
                      rule.retired: the oldest retires, draw           then hand out
    hand out          number the turns of the newly decided periods, then walk every
                      group's order as far as the rule released it and put what it
                      passes on the group's queue (the caller's group: one item per
                      period, two where the retire cut splits it, so that a progress()
                      call can stop at either)

Why it cannot deadlock (both engines): order all units by (period, position in the
submission order). Every wait of a unit (a dependency, a turn, its group's FIFO) is on
a unit earlier in that order (the stage rules make it so), and the earliest unfinished
unit is always handed out: for the clock its period is released before anyone waits on
its iteration; for the data-flow engine, with ``max_depth >= depth`` its iteration has
a context, and a smaller ``max_depth`` is accepted only if ``paper.check`` runs the
plan to the end with it. The caller's group runs in each call only up to the oldest
iteration's last period, and everything such a unit waits for is handed out already;
within that period it may stop after the oldest iteration's last units
(``Schedule.runs_before_retire``): every unit earlier in the order is then run or handed
out, so the oldest completes.
"""

from __future__ import annotations

import functools
import itertools
import operator
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..plan.context import IterContext
from .modes import Modes
from . import paper
from .release import Entries, Fetch, Released, ReleaseRule
from .runtime import BoundTask
from .schedule import WHOLE_PERIOD, Position, Schedule
from .worker import CallerWorker

__all__: List[str] = []

_period_of = operator.itemgetter(0)  # a unit's period
_yield_gil = functools.partial(time.sleep, 0)  # let a worker just handed work take the GIL now
Put = Callable[..., None]  # a thread group's queue: put(units, modes[, period])


class HandOut:
    """One run's hand-out of work (see the module docstring).

    Args:
        schedule, rule: the pipeline's schedule and its engine's release rule.
        draw: draws the next batch as an iteration's context (``feed.Feed.draw``): None when there is none.
        puts: each thread group's queue (``put``).
        tasks: the run's bound tasks, whose turns are numbered here.
        caller: the caller's group's worker, if a group runs on the caller's thread.
        yield_after_hand_out: let a worker just handed work take the GIL at once (several worker threads).
    """

    def __init__(self, schedule: Schedule, rule: ReleaseRule, draw: Fetch[IterContext], puts: Mapping[str, Put],
                 tasks: Sequence[BoundTask], caller: Optional[CallerWorker] = None,
                 yield_after_hand_out: bool = False) -> None:
        self.schedule, self.rule, self.draw, self.tasks, self.caller = schedule, rule, draw, tasks, caller
        self.entries: Entries[IterContext] = Entries()
        self.positions: Dict[str, Position] = {group: (0, 0) for group in schedule.lanes}
        self.numbered = 0  # periods whose turn-taking units are numbered
        self.caller_group = caller.group if caller is not None else None
        # With several worker threads, one just handed work may be the bottleneck: let it take the GIL at
        # once instead of after whatever the caller does next. Not when a group runs on the caller's thread:
        # the caller's next job is then that group's units, and yielding would put the workers' first.
        self.yield_after_hand_out = yield_after_hand_out and caller is None
        # per group: its queue's put, and whether it takes one item per period (the caller's group)
        self._puts: List[Tuple[Put, bool]] = [(puts[group], group == self.caller_group) for group in schedule.lanes]
        lane = schedule.lanes.get(self.caller_group, ()) if self.caller_group is not None else ()
        self._caller_len = len(lane)  # a whole period of the caller's group: its units, and those before the cut
        self._caller_before = sum(slot.position <= schedule.retire_cut for slot in lane)
        if self._caller_before == len(lane):
            self._caller_before = 0  # (0: the cut does not split the group's period)
        self._caller_through: Callable[[], int] = functools.partial(rule.caller_through, self.entries)

    # -- what the engine calls -----------------------------------------------------------------------

    def fill(self, modes: Optional[Modes]) -> None:
        """The first hand-outs of a run (``modes``: the driving call's torch modes, which its units run under)."""
        self.resume(modes)

    def resume(self, modes: Optional[Modes]) -> None:
        """Draw as the fill does (also after ``progress(None)`` emptied the pipeline), handing out after each
        step: the clock's fill then hands each group one period at a time, as in the steady state, so that a
        worker never holds a list of units of several iterations that retire while it runs the last one."""
        for _ in range(self.rule.fill_steps):
            self.rule.fill_step(self.entries, self.draw)
            self._hand_out(self.rule.released(self.entries), modes)

    def run_caller_units(self, advance: bool = True) -> None:
        """What a ``progress()`` call runs of the caller's group before it retires the oldest iteration: up to
        the oldest's last period (the rule's ``caller_through``) and, of it, up to the last stage's units
        (``Schedule.runs_before_retire``), or all of it when the step holds (``advance`` False)."""
        caller = self.caller
        if caller is not None:
            caller.run_queued(self._caller_through(), self.schedule.retire_cut if advance else WHOLE_PERIOD)

    def after_retire(self, oldest: int, draws: bool, modes: Optional[Modes]) -> None:
        """Iteration ``oldest`` retired: the rule draws what comes next (``draws`` False: a step without a batch)
        and the hand-out follows, under ``modes``."""
        self._hand_out(self.rule.retired(self.entries, oldest, self.draw if draws else None), modes)

    def boundary(self, retired: int) -> Dict[int, int]:
        """What runs, if nothing more is handed out, of the units handed out (``paper.boundary``): every one
        that does not wait, directly or through others, on a unit not handed out (``retired``: the iterations
        below it are done)."""
        entered = {period: ctx.iter_idx for period, ctx in self.entries.entered.items() if ctx.iter_idx >= retired}
        if not entered:
            return {}
        first = min(entered)
        handed = {}
        for group, slots in self.schedule.lanes.items():
            end = self.positions[group]
            if self.caller is not None and group == self.caller_group:  # it runs only inside progress(): what
                period, cut = self.caller.ran_to  # it ran (every unit up to its last stop) is done, the rest waits
                end = min(end, (period, sum(slot.position <= cut for slot in slots)))
            handed[group] = self.schedule.lane_units(group, (first, 0), end, entered)
        return paper.boundary(self.schedule, handed, entered, range(first, self.numbered), retired)

    def let_go(self) -> None:
        """The run stopped: drop the contexts still entered (they hold the caller's batches)."""
        self.entries.entered.clear()

    # -- handing out -----------------------------------------------------------------------------------

    def _hand_out(self, released: Released, modes: Optional[Modes]) -> None:
        entries, schedule = self.entries, self.schedule
        horizon = entries.horizon(schedule.depth)
        if schedule.turn_slots:
            self._number_turns(min(*released, horizon))  # (through_period, decided)
        for (put, by_period), units in zip(self._puts, schedule.walk_all(self.positions, entries.entered, released,
                                                                          horizon)):
            if not units:
                continue
            if not by_period:
                put(units, modes)
                continue
            # the caller's group: one queue item per period, or two where the retire cut splits it (see
            # CallerWorker.run_queued); the clock's every hand-out is one period, in the steady state whole
            first, cut, before = units[0][0], self.schedule.retire_cut, self._caller_before
            if units[-1][0] == first and (not before or len(units) == self._caller_len):
                if before:
                    put(units[:before], modes, first)
                    put(units[before:], modes, first)
                else:
                    put(units, modes, first)
                continue
            for period, of_period in itertools.groupby(units, _period_of):
                self._put_period(put, list(of_period), period, modes, cut)
        if self.yield_after_hand_out:
            _yield_gil()

    @staticmethod
    def _put_period(put: Callable[..., None], units: List[Any], period: int, modes: Any, cut: int) -> None:
        """Put ``units``, the caller's units of ``period`` in submission order, as one queue item, or as two where
        the retire cut ``cut`` falls between them."""
        if units[0][1].position <= cut < units[-1][1].position:  # (period, slot, context)
            k = len(units) - 1
            while units[k - 1][1].position > cut:
                k -= 1
            put(units[:k], modes, period)
            units = units[k:]
        put(units, modes, period)

    def _number_turns(self, through: int) -> None:
        """Number the turn-taking units of every period up to ``through`` not numbered yet (``Schedule.turn_units``),
        on the run's ``signals.Turns``."""
        entered, schedule, tasks = self.entries.entered, self.schedule, self.tasks
        while self.numbered <= through:
            for slot, ctx in schedule.turn_units(self.numbered, entered):
                task, key, label = tasks[slot.index], (slot.index, ctx.iter_idx), f"{slot.task}(i{ctx.iter_idx})"
                if task.stream_turns is not None:
                    task.stream_turns.assign(key, label)
                if task.turns is not None:
                    task.turns.assign(key, label)
            self.numbered += 1
