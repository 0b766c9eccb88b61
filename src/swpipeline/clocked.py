"""SWPipeline: the clock-driven engine.

Each ``progress()`` is one clock tick: retire the oldest iteration, then release one
*period*, in which every task runs once, on iteration ``period - stage``::

    fill_pipeline():  release P0 .. P{depth-1}              (iterations 0 .. depth-1 enter)
    progress() #k:    retire iteration k, release P{depth+k}  (iteration depth+k enters)

    depth 3      P0   P1   P2   P3   P4
    stage 2      --   --   i0   i1   i2      <- retire i0 before releasing P3
    stage 1      --   i0   i1   i2   i3
    stage 0      i0   i1   i2   i3   i4

What a period runs, and in which order, is data (``schedule.Schedule``), computed once
from the plan; releasing a period hands each thread group its units of it as one queue
item, in that order. Periods in which nothing runs (after ``progress(None)``, before the
first batch reaches a stage, after the last batch) cost nothing: the clock skips them.

Why this cannot deadlock: order all work units by (period, position in the submission
order). Every dependency a unit waits on is strictly earlier in that order (an earlier
period, or the same period and earlier in the topological submission order, by the
stage rules), each worker's queue is FIFO in that order, and the turns (the sequencer
of globally ordered tasks, each stream shared by thread groups) follow it too; so the
earliest unfinished unit never waits. ``Schedule.check`` runs the schedule on paper at
construction as well.

The step boundary (``progress(advance=False)``): every unit of the periods released so
far can finish without anything more being released, by the same argument restricted to
those periods (a unit waits only on earlier units, all released, and its turn was
numbered when its period was); so the boundary waits for all of them, and once they are
done no worker has anything left to start until ``advance()`` releases the next period.

After ``progress(None)`` retired every iteration in flight, ``progress(data)`` resumes:
``depth`` periods are released from the current one, fetching as the fill does.
"""

from __future__ import annotations

import functools
import time

from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from . import ordering
from .analysis.report import PlanAnalysis
from .base import _PipelineBase
from .device import DeviceSpec
from .executor import AfterComplete
from .plan import IterContext, PipelinePlan
from .records import PathLike
from .run import Run
from .runtime import TaskRuntime
from .schedule import Schedule
from .tables import ScheduleRow, format_period_table, format_stage_analysis
from .worker import Worker

__all__: List[str] = []

_yield_gil = functools.partial(time.sleep, 0)  # let a worker just handed work take the GIL now


class _Clock:
    """SWPipeline's policy for one run: the period clock over the schedule."""

    after_complete: Optional[AfterComplete] = None

    def __init__(self, run: Run, schedule: Schedule) -> None:
        self.run, self.schedule = run, schedule
        self.period = 0  # the next period to release
        self.entered: Dict[int, IterContext] = {}  # period -> the iteration that entered in it (until it retires)
        self.entry_period: Dict[int, int] = {}  # iteration -> the period it entered in
        self.lanes: List[Tuple[Callable[..., None], List[Tuple[TaskRuntime, int]]]] = []  # see fill()
        self.yield_after_hand_out = False  # see fill()

    def fill(self, data_iter: Iterator[Any]) -> None:
        run = self.run
        # each thread group's queue, with its slots in submission order as (the run's task, its stage)
        self.lanes = [(run.workers[group].put, [(run.tasks[s.index], s.stage) for s in slots])
                      for group, slots in self.schedule.group_slots().items()]
        # With several worker threads, one just handed work may be the bottleneck: let it take the GIL
        # at once instead of after whatever the caller does next (up to its next wait). Not when a group
        # runs on the caller's thread: the caller's next job is then that group's units, usually the
        # last stage, and yielding first would put the workers' units in front of them.
        self.yield_after_hand_out = run.inline is None and sum(isinstance(w, Worker)
                                                              for w in run.workers.values()) > 1
        self.resume(data_iter)

    def resume(self, data_iter: Iterator[Any]) -> None:
        """Release ``depth`` periods from the current one, fetching a batch in each (as the fill does)."""
        first, depth = self.period, self.schedule.depth
        while self.period < first + depth and not self.run.exhausted:
            self._release(data_iter)
        self._release_through(first + depth - 1)

    def after_retire(self, oldest: int, data_iter: Optional[Iterator[Any]]) -> None:
        self.entered.pop(self.entry_period.pop(oldest))
        self._release(data_iter)
        # After progress(None) the clock ran without a new batch; make sure the next
        # iteration to retire has all its stages released before anyone waits for it.
        nxt = self.entry_period.get(oldest + 1)
        if nxt is not None and nxt + self.schedule.depth > self.period:
            self._release_through(nxt + self.schedule.depth - 1)

    def caller_through(self) -> Optional[int]:
        return None  # the caller's group runs all it was handed: the units of the periods released so far

    def boundary(self) -> Dict[int, int]:
        """Every unit of the periods released so far (they wait only on one another: see the module docstring)."""
        last_period = self.period - 1
        entries = list(self.entered)  # ascending: iterations enter in increasing periods
        targets: Dict[int, int] = {}
        for slot in self.schedule.slots:
            entry = next((e for e in reversed(entries) if e + slot.stage <= last_period), None)
            if entry is not None:
                targets[slot.index] = self.entered[entry].iter_idx
        return targets

    def _release(self, data_iter: Optional[Iterator[Any]]) -> None:
        """Tick: fetch the batch entering this period (if any), then hand out the period's units."""
        period = self.period
        self.period = period + 1
        ctx = self.run.fetch(data_iter)
        if ctx is not None:
            self.entered[period] = ctx
            self.entry_period[ctx.iter_idx] = period
        self._hand_out(period)

    def _release_through(self, last: int) -> None:
        """Advance the clock to ``last`` without fetching, handing out only the periods that have work."""
        for period in self.schedule.busy_periods(self.period, last, list(self.entered)):
            self._hand_out(period)
        self.period = max(self.period, last + 1)

    def _hand_out(self, period: int) -> None:
        """Number the period's turn-taking units, then hand each thread group its units of the period.

        A group's units are ``schedule.units(period, entered)`` restricted to the group, in
        the same (submission) order, built from the group's own slots.
        """
        entered = self.entered
        if self.schedule.turn_slots:
            self.schedule.assign_turns(period, lambda entry: self._iteration(entered.get(entry)), self.run.tasks)
        get, modes = entered.get, self.run.modes
        for put, slots in self.lanes:
            units = [(task, ctx, period) for task, stage in slots if (ctx := get(period - stage)) is not None]
            if units:
                put(units, modes)
        if self.yield_after_hand_out:
            _yield_gil()

    @staticmethod
    def _iteration(ctx: Optional[IterContext]) -> Optional[int]:
        return None if ctx is None else ctx.iter_idx


class SWPipeline(_PipelineBase):
    """Clock-driven software pipeline: ``depth = max(stage) + 1`` iterations in flight.

    Args:
        plan: the PipelinePlan; its stages must follow the stage rules (an intra-iteration
            dependency is at the same or an earlier stage; an inter-iteration one at most one
            stage later).
        device: None (current accelerator, else CPU), an index, ``"cpu"``, ``"cuda:1"``,
            a torch.device, or a Device instance (e.g. ``SimulatedDevice()`` in tests).
        signal_timeout: seconds a task may wait for one dependency (default 30).
        progress_timeout: seconds progress() may wait for the oldest iteration (default 60).
        join_timeout: seconds stopping may wait, in total, for worker threads still inside a task
            (default 10); a thread still running then is left to finish on its own, and a
            later ``fill_pipeline()`` refuses to start until it has.
        worker_init: called as ``worker_init(thread_group)`` at the start of each worker thread
            (e.g. to pin a compute thread to a core); an exception fails the pipeline.
        check_races: check every context access of every task against the plan's declared
            dependencies while it runs, and raise ``RaceError`` naming both tasks, the attribute
            and the iterations for two conflicting accesses the dependencies do not order (a
            few microseconds per access; see ``RaceChecker``).
        free_early: delete each context attribute as soon as every task that uses it has finished
            the iteration, instead of when the iteration retires: ``True`` when every task declares
            its ``reads=`` and ``writes=``, or a ``PlanAnalysis`` (``analyze(plan, batch)``).
        keep: attributes ``free_early`` leaves on the context until the iteration retires (what
            you read from a retired context, e.g. ``keep=("loss",)``).
        caller_thread_group: a thread group whose tasks run on the thread that drives the
            pipeline (each ``progress()`` first runs what was queued for it) instead of on a worker
            thread: no hand-off at all for that group. The order and deadlock argument are the
            same as for a worker; ``worker_init`` is not called for it. ``"auto"`` (the default):
            ``run()`` runs the group of the plan's last stage so (unless ``worker_init`` is given),
            while ``fill_pipeline()``/``progress()`` give every group a worker thread, so that the
            pipeline keeps going while the caller does other work between calls. ``None``: every
            group always on a worker thread.

    Raises:
        TypeError, ValueError: the plan breaks a stage rule or an argument is invalid.
    """

    def __init__(self, plan: PipelinePlan, device: DeviceSpec = None, *, signal_timeout: float = 30.0,
                 progress_timeout: float = 60.0, join_timeout: float = 10.0,
                 worker_init: Optional[Callable[[str], None]] = None,
                 caller_thread_group: Optional[str] = "auto", check_races: bool = False,
                 free_early: Union[bool, PlanAnalysis] = False, keep: Iterable[str] = ()) -> None:
        if not isinstance(plan, PipelinePlan):
            raise TypeError(f"plan must be a PipelinePlan, got {type(plan).__name__}")
        self.depth: int = plan.depth
        super().__init__(plan, self.depth, device, signal_timeout=signal_timeout,
                         progress_timeout=progress_timeout, join_timeout=join_timeout, worker_init=worker_init,
                         check_races=check_races, free_early=free_early, keep=keep,
                         caller_thread_group=caller_thread_group)
        for num_batches in sorted({1, self.depth, 2 * self.depth + 1}):
            self._schedule.check(num_batches)
        self._enqueue_order = [self._by_name[s.task] for s in self._schedule.slots]

    def _new_policy(self, run: Run) -> _Clock:
        return _Clock(run, self._schedule)

    # -- inspection ---------------------------------------------------------------------------

    def format_schedule(self, num_periods: int) -> str:
        """The period x task table as a string (rows stage-descending, topological within a stage)."""
        return format_period_table(self._schedule_rows(num_periods), num_periods)

    def _schedule_rows(self, num_periods: int) -> List[ScheduleRow]:
        if isinstance(num_periods, bool) or not isinstance(num_periods, int) or num_periods < 1:
            raise ValueError(f"num_periods must be a positive int, got {num_periods!r}")
        rows: List[ScheduleRow] = []
        for slot, cells in self._schedule.cells(num_periods):
            if slot.task in self._shortcuts.enabled:  # a shortcut task replays its cache
                cells = ["." if c != "--" else c for c in cells]
            rows.append((self._shortcuts.label(slot.task), slot.group, slot.stream, cells))
        return rows

    def print_schedule(self, num_periods: int) -> None:
        """Print ``format_schedule(num_periods)``."""
        print(self.format_schedule(num_periods))

    def save_schedule_chart(self, path: PathLike, num_periods: int) -> None:
        """Draw the ``print_schedule`` table as a PNG picture, cells coloured by iteration (needs matplotlib)."""
        from .charts import save_period_table

        save_period_table(self._schedule_rows(num_periods), path,
                          title=f"SWPipeline schedule: depth {self.depth}, {num_periods} periods")

    def format_stage_analysis(self) -> str:
        """Tasks in serial order with their stage, and the LDS check: the longest chain of dependent tasks whose
        stages strictly increase, against the depth (equal: every stage boundary separates a producer from a
        consumer that needs it)."""
        position = {t.name: k for k, t in enumerate(self._enqueue_order)}
        rows = [(self._shortcuts.label(t.name), position[t.name], t.stage, self._task_type(t))
                for t in self._serial_order]
        chain = [(n, self.plan.stage(n)) for n in ordering.longest_stage_chain(self.plan)]
        return format_stage_analysis(rows, chain, self.depth)

    def print_stage_analysis(self) -> None:
        """Print ``format_stage_analysis()``."""
        print(self.format_stage_analysis())

    def _task_type(self, task: TaskRuntime) -> str:
        return "skip" if task.name in self._shortcuts.enabled else "stream"

    @property
    def enqueue_order(self) -> List[str]:
        """The order in which one period's tasks are submitted."""
        return [t.name for t in self._enqueue_order]

    def __repr__(self) -> str:
        head = (f"SWPipeline(device={self._device_text()}, depth={self.depth}, tasks={self.plan.task_names}, "
                f"shortcuts={self.shortcuts})")
        return f"{head}\n\n{self.format_schedule(self.depth)}"
