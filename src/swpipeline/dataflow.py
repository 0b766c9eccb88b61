"""DataFlowPipeline: the data-flow engine. No clock: work starts as soon as its data is there.

It runs the same plan as ``SWPipeline`` and computes the same thing: every thread
group runs exactly the same sequence of units, in the same order (the clock-driven
schedule, ``schedule.Schedule``, read as one sequence per thread group over *virtual*
periods, iteration ``i`` entering in period ``i``). What it drops is the clock: a unit
is handed to its worker as soon as its iteration has a context, not when ``progress()``
reaches its period, so a thread group runs as far ahead as its order, its
dependencies and the number of live contexts allow.

Contexts are created eagerly, up to ``max_depth`` alive at once: a dependency-free
task on its own thread group, such as a copy, runs up to ``max_depth - 1`` iterations
ahead of the bottleneck and buffers its jitter::

    max_depth 3   t0    t1    t2    t3    t4
    Copy          0 1 2       3     4           <- runs ahead while contexts are free
    Compute       0     1     2     3           <- the bottleneck, never starved

Why it cannot deadlock, for a ``max_depth`` that ``__init__`` accepted: order all
units by (virtual period, position in the submission order). Every wait of a unit (a
dependency, a turn in the sequencer or on a shared stream, a thread group's FIFO)
is on a unit earlier in that order, so the earliest unfinished unit can run as soon as
its iteration has a context. With ``max_depth >= depth`` it always has one (the
iteration ``max_depth`` older, whose units all come earlier, has retired); a smaller
``max_depth`` is accepted only if ``Schedule.check`` runs the plan to the end with it.

A thread group on the caller's thread (``caller_thread_group``; by default ``run()``
runs the last stage's group so) runs its units only inside ``progress()``, and only
those of virtual periods up to ``oldest + depth - 1``, the last one the oldest
iteration has units in: the caller must come back to retire and hand out the next
iteration. Everything such a unit waits for is handed out already: it comes earlier
in the order, and a unit that is not handed out yet sits behind a unit of an
iteration that does not exist yet, of virtual period at least ``oldest + max_depth``
(>= ``oldest + depth``), later than the caller's unit. So the argument above holds
with the caller as one more FIFO worker. With ``max_depth < depth`` no group runs on
the caller's thread.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, List, Optional, Union

from .analysis.report import PlanAnalysis
from .base import _PipelineBase
from .device import DeviceSpec
from .executor import AfterComplete
from .plan import PipelinePlan
from .run import Run
from .schedule import Schedule, ScheduleError

__all__: List[str] = []


class _Sequences:
    """DataFlowPipeline's policy for one run: each thread group's units, handed out once their iteration exists."""

    after_complete: Optional[AfterComplete] = None

    def __init__(self, run: Run, schedule: Schedule, max_depth: int) -> None:
        self.run, self.schedule, self.max_depth = run, schedule, max_depth
        self.slots = schedule.group_slots()
        self.highest_stage = {group: max(s.stage for s in slots) for group, slots in self.slots.items()}
        self.cursors = {group: (0, 0) for group in self.slots}  # (virtual period, next slot) per thread group
        self.known = 0  # periods 0 .. known-1 are known: their turn-taking units are numbered
        self.final: Optional[int] = None  # the number of iterations, once the data is exhausted

    def fill(self, data_iter: Iterator[Any]) -> None:
        self._top_up(data_iter)

    def after_retire(self, oldest: int, data_iter: Optional[Iterator[Any]]) -> None:
        self._top_up(data_iter)

    def _top_up(self, data_iter: Optional[Iterator[Any]]) -> None:
        """Fetch batches while fewer than max_depth iterations are alive; hand out what that allows."""
        run = self.run
        while len(run.contexts) < self.max_depth and run.fetch(data_iter) is not None:
            pass
        if run.exhausted:
            self.final = run.num_created
        # Period p is known once iteration p exists (or cannot, the data being exhausted).
        last = run.num_created - 1 if self.final is None else self.final + self.schedule.depth - 2
        while self.known <= last:
            self.schedule.assign_turns(self.known, self._iteration, run.tasks)
            self.known += 1
        self._hand_out(run.num_created)

    def _iteration(self, entry: int) -> Optional[int]:
        """The iteration that entered in virtual period ``entry``: iteration ``entry``, if there is one."""
        exists = 0 <= entry < self.run.num_created and (self.final is None or entry < self.final)
        return entry if exists else None

    def _hand_out(self, published: int) -> None:
        run, final = self.run, self.final
        for group, slots in self.slots.items():
            period, k = self.cursors[group]
            units = []
            while True:
                if k == len(slots):
                    period, k = period + 1, 0
                    if final is not None and period - self.highest_stage[group] >= final:
                        break  # every iteration of this group's later periods is past the last one
                    continue
                slot = slots[k]
                it = period - slot.stage
                if it >= published and final is None:
                    break  # wait until its iteration has a context
                if 0 <= it < published:
                    units.append((run.tasks[slot.index], run.contexts[it], None))
                k += 1
            self.cursors[group] = (period, k)
            if units:
                run.workers[group].put(units, run.modes)


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

    def _inline_through(self, run: Run) -> Optional[int]:
        # Only the units up to the period that completes the oldest iteration: with max_depth >= depth,
        # everything they wait for is then handed out (see "Why it cannot deadlock" above).
        return run.next_retire + self._schedule.depth - 1

    # -- inspection ---------------------------------------------------------------------------

    def __repr__(self) -> str:
        deps = {t.name: self.plan.intra[t.name] for t in self._serial_order}
        return (f"DataFlowPipeline(device={self.device}, max_depth={self.max_depth}, "
                f"tasks={[t.name for t in self._serial_order]}, shortcuts={self.shortcuts}, "
                f"intra_iter_deps={deps}, inter_iter_deps={ {k: v for k, v in self.plan.inter.items() if v} })")
