"""DataFlowPipeline: the data-flow engine. No clock: work starts as soon as its data is there.

It runs the same plan as ``SWPipeline`` and computes the same thing: every thread
group runs exactly the same sequence of units, in the same order (the clock-driven
schedule, ``schedule.Schedule``, read as one sequence per thread group over *virtual*
periods, iteration ``i`` entering in period ``i`` unless a step had no batch, below).
What it drops is the clock: a unit is handed to its worker as soon as its iteration
has a context, not when ``progress()`` reaches its period, so a thread group runs as
far ahead as its order, its dependencies and the number of live contexts allow.

Contexts are created eagerly, up to ``max_depth`` alive at once: a dependency-free
task on its own thread group, such as a copy, runs up to ``max_depth - 1`` iterations
ahead of the bottleneck and buffers its jitter::

    max_depth 3   t0    t1    t2    t3    t4
    Copy          0 1 2       3     4           <- runs ahead while contexts are free
    Compute       0     1     2     3           <- the bottleneck, never starved

A step without a batch (``progress(None)``, and ``drain()``) leaves virtual periods in
which no iteration enters, as the clock does: it decides that none enters up to the
next iteration's last period, so each group's order reaches that iteration's units
(one of them may sit behind a unit of an iteration not fetched yet) and the turns of
those periods are numbered. A later batch enters after them, its iteration number
the next one.

Why it cannot deadlock, for a ``max_depth`` that ``__init__`` accepted: order all
units by (virtual period, position in the submission order). Every wait of a unit (a
dependency, a turn in the sequencer or on a shared stream, a thread group's FIFO)
is on a unit earlier in that order, so the earliest unfinished unit can run as soon as
its iteration has a context. With ``max_depth >= depth`` it always has one (the
iteration ``max_depth`` older, whose units all come earlier, has retired); a smaller
``max_depth`` is accepted only if ``Schedule.check`` runs the plan to the end with it.
Periods without an iteration only take units away.

A thread group on the caller's thread (``caller_thread_group``; by default ``run()``
runs the last stage's group so) runs its units only inside ``progress()``, and only
those of virtual periods up to ``e + depth - 1``, ``e`` the period the oldest iteration
entered in: its last one. The caller must come back to retire and hand out the next
iteration. Everything such a unit waits for is handed out already: it comes earlier
in the order, and a unit that is not handed out yet sits behind a unit of a period not
decided yet, at least ``e + depth`` (``max_depth >= depth`` iterations were fetched, or a
step without a batch decided the periods through the oldest's last one), later than the
caller's unit. So the argument above holds with the caller as one more FIFO worker.
With ``max_depth < depth`` no group runs on the caller's thread.

The step boundary (``progress(advance=False)``, see ``base``) waits for the units handed
out that do not wait, directly or through others, on a unit not handed out
(``Schedule.settle`` finds them on paper: they are what runs if nothing more is handed
out, whatever the timing). That includes later iterations' units the engine ran ahead
on, within the live contexts; the caller's group has run up to the oldest iteration's
last period, as above, and runs nothing in between.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from .analysis.report import PlanAnalysis
from .base import _PipelineBase
from .device import DeviceSpec
from .executor import AfterComplete
from .plan import IterContext, PipelinePlan
from .run import Run
from .schedule import Schedule, ScheduleError, Slot
from .worker import Unit

__all__: List[str] = []


class _Sequences:
    """DataFlowPipeline's policy for one run: each thread group's units, handed out once their iteration exists."""

    after_complete: Optional[AfterComplete] = None

    def __init__(self, run: Run, schedule: Schedule, max_depth: int) -> None:
        self.run, self.schedule, self.max_depth = run, schedule, max_depth
        self.slots = schedule.group_slots()
        self.highest_stage = {group: max(s.stage for s in slots) for group, slots in self.slots.items()}
        self.cursors = {group: (0, 0) for group in self.slots}  # (virtual period, next slot) per thread group
        self.entered: Dict[int, IterContext] = {}  # virtual period -> the iteration that entered in it (until retired)
        self.entry_period: Dict[int, int] = {}  # iteration -> the virtual period it entered in (until retired)
        self.next_entry = 0  # the period the next batch enters in: every earlier one is decided (entered or a gap)
        self.last_entry = -1  # the period the newest iteration entered in
        self.final = False  # the data is exhausted: no batch enters any more
        self.known = 0  # periods 0 .. known-1 are known: their turn-taking units are numbered
        self.caller_group: Optional[str] = None  # the group on the caller's thread, if any (known at fill)
        self.ran_through = -1  # the last period whose units the caller's group has run (see caller_through)

    def fill(self, data_iter: Iterator[Any]) -> None:
        self.caller_group = self.run.inline.group if self.run.inline is not None else None
        self._top_up(data_iter)

    def resume(self, data_iter: Iterator[Any]) -> None:
        self._top_up(data_iter)

    def after_retire(self, oldest: int, data_iter: Optional[Iterator[Any]]) -> None:
        self.entered.pop(self.entry_period.pop(oldest))
        if data_iter is None and self.entry_period:
            # No batch now: decide the periods up to the next iteration's last one as gaps, so that
            # each thread group's order can reach that iteration's units (and its turns be numbered).
            self.next_entry = max(self.next_entry, self.entry_period[oldest + 1] + self.schedule.depth)
        self._top_up(data_iter)

    def _top_up(self, data_iter: Optional[Iterator[Any]]) -> None:
        """Fetch batches while fewer than max_depth iterations are alive; hand out what that allows."""
        run = self.run
        while len(run.contexts) < self.max_depth:
            ctx = run.fetch(data_iter)
            if ctx is None:
                break
            self.entered[self.next_entry] = ctx
            self.entry_period[ctx.iter_idx] = self.last_entry = self.next_entry
            self.next_entry += 1
        self.final = run.exhausted
        # A period is known once every entry up to it is decided; after the data ends, all are.
        last = self.next_entry - 1
        if self.final:
            last = max(last, self.last_entry + self.schedule.depth - 1)
        while self.known <= last:
            self.schedule.assign_turns(self.known, self._iteration, run.tasks)
            self.known += 1
        self._hand_out()

    def _iteration(self, entry: int) -> Optional[int]:
        """The iteration that entered in virtual period ``entry``, if one did (None: a gap, or past the data)."""
        ctx = self.entered.get(entry)
        return None if ctx is None else ctx.iter_idx

    def _hand_out(self) -> None:
        run, final, next_entry, entered = self.run, self.final, self.next_entry, self.entered
        for group, slots in self.slots.items():
            period, k = self.cursors[group]
            worker, by_period = run.workers[group], group == self.caller_group
            units: List[Unit] = []
            while True:
                if k == len(slots):
                    if by_period and units:  # the caller's group: one item per period (see caller_through)
                        worker.put(units, run.modes, period)
                        units = []
                    period, k = period + 1, 0
                    if final and period - self.highest_stage[group] >= next_entry:
                        break  # every later entry of this group's periods is past the last one
                    continue
                slot = slots[k]
                entry = period - slot.stage
                if entry >= next_entry and not final:
                    break  # wait until it is decided whether an iteration enters there
                ctx = entered.get(entry)
                if ctx is not None:
                    units.append((run.tasks[slot.index], ctx, None))
                k += 1
            self.cursors[group] = (period, k)
            if units:
                worker.put(units, run.modes, period)

    def caller_through(self) -> int:
        """The oldest iteration's last period: the caller's group runs up to it in this call (the module
        docstring)."""
        self.ran_through = self.entry_period[self.run.next_retire] + self.schedule.depth - 1
        return self.ran_through

    def boundary(self) -> Dict[int, int]:
        """What runs, if nothing more is handed out, of the units handed out (``Schedule.settle``): every one
        that does not wait, directly or through others, on a unit not handed out."""
        if not self.entered:
            return {}
        first, entered = min(self.entered), self.entered
        queues: Dict[str, List[Tuple[int, Slot]]] = {}
        for group, slots in self.slots.items():
            end = self.cursors[group]
            if group == self.caller_group:  # it runs only inside progress(): what it ran is done, the rest waits
                end = min(end, (self.ran_through + 1, 0))
            queue = queues[group] = []
            for period in range(first, end[0] + 1):
                for k, slot in enumerate(slots):
                    if (period, k) >= end:
                        break
                    ctx = entered.get(period - slot.stage)
                    if ctx is not None:
                        queue.append((ctx.iter_idx, slot))
        turn_orders: Dict[object, List[Tuple[int, int]]] = {}
        for period in range(first, self.known):
            for slot in self.schedule.turn_slots:
                ctx = entered.get(period - slot.stage)
                if ctx is not None:
                    for line in self.schedule.turn_lines(slot):
                        turn_orders.setdefault(line, []).append((slot.index, ctx.iter_idx))
        return self.schedule.settle(queues, turn_orders, self.run.next_retire)


class DataFlowPipeline(_PipelineBase):
    """Data-flow software pipeline: at most ``max_depth`` iterations in flight, no period clock.

    Each thread group runs the same units in the same order as ``SWPipeline`` runs them
    for the same plan (so both compute the same results), each as soon as its iteration
    has a context and its dependencies are done.

    Args:
        plan: the PipelinePlan; its stages follow the same rules as for ``SWPipeline`` and
            decide the order of the units on each thread group.
        max_depth: the most iterations alive at once (>= 1). Any ``max_depth >= depth`` works;
            a smaller one only if the plan's order can complete with that few iterations
            alive (checked here, with a clear error otherwise).

    The other arguments (``device``, ``signal_timeout``, ``progress_timeout``, ``join_timeout``,
    ``worker_init``, ``check_races``, ``free_early``, ``keep``, ``caller_thread_group``) are as for
    ``SWPipeline``; a thread group runs on the caller's thread only with ``max_depth`` >= the plan's
    depth (``"auto"`` keeps every group on a worker below that, a named group is refused).

    Raises:
        TypeError, ValueError: the plan breaks a stage rule, ``max_depth`` is not a positive int
            or too small for the plan, or another argument is invalid.
    """

    def __init__(self, plan: PipelinePlan, max_depth: int = 2, device: DeviceSpec = None, *,
                 signal_timeout: float = 30.0, progress_timeout: float = 60.0, join_timeout: float = 10.0,
                 worker_init: Optional[Callable[[str], None]] = None, check_races: bool = False,
                 free_early: Union[bool, PlanAnalysis] = False, keep: Iterable[str] = (),
                 caller_thread_group: Optional[str] = "auto") -> None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
            raise ValueError(f"max_depth must be an int >= 1 (the most iterations in flight), got {max_depth!r}")
        self.max_depth = max_depth
        super().__init__(plan, max_depth, device, signal_timeout=signal_timeout, progress_timeout=progress_timeout,
                         join_timeout=join_timeout, worker_init=worker_init, check_races=check_races,
                         free_early=free_early, keep=keep, caller_thread_group=caller_thread_group)
        self._check_max_depth()

    def _check_max_depth(self) -> None:
        depth, max_depth = self._schedule.depth, self.max_depth

        def runs(live: int) -> Optional[ScheduleError]:
            try:
                for num_batches in sorted({1, depth, 2 * depth + live + 1}):
                    self._schedule.check(num_batches, max_live=live)
            except ScheduleError as stuck:
                return stuck
            return None

        stuck = runs(max_depth) if max_depth < depth else None
        if stuck is not None:
            need = next(live for live in range(max_depth + 1, depth + 1) if runs(live) is None)
            raise ValueError(
                f"max_depth={max_depth} is too small for this plan: each thread group runs its units in the order "
                f"SWPipeline runs them (on a stream, older iterations first; the stages set how iterations "
                f"interleave), and that order needs {need} iterations alive at once ({stuck.blocked}); use "
                f"max_depth >= {need}, or lower the stages"
            )

    def _new_policy(self, run: Run) -> _Sequences:
        return _Sequences(run, self._schedule, self.max_depth)

    def _caller_group_refusal(self) -> Optional[str]:
        depth = self._schedule.depth
        if self.max_depth < depth:
            return (f"a thread group on the caller's thread needs max_depth >= the plan's depth ({depth}), got "
                    f"max_depth={self.max_depth}: with fewer live iterations its units could wait for work the "
                    f"caller hands out only after retiring an iteration; raise max_depth or pass None")
        return None

    # -- inspection ---------------------------------------------------------------------------

    def __repr__(self) -> str:
        deps = {t.name: self.plan.intra[t.name] for t in self._serial_order}
        return (f"DataFlowPipeline(device={self._device_text()}, max_depth={self.max_depth}, "
                f"tasks={[t.name for t in self._serial_order]}, shortcuts={self.shortcuts}, "
                f"intra_iter_deps={deps}, inter_iter_deps={ {k: v for k, v in self.plan.inter.items() if v} })")
