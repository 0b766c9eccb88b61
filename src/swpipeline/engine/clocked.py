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
from the plan; the clock is the engine's release rule (``release.ClockRule``), and
``handout.HandOut`` hands each thread group its units of the released periods, in its
order. Periods in which nothing runs (after ``progress(None)``, before the first batch
reaches a stage, after the last batch) cost nothing. Why this cannot deadlock is
written in ``handout``; ``paper.check`` also runs the schedule on paper at
construction, with the caller's thread group.

The step boundary (``progress(advance=False)``): every unit of the periods released so
far can finish without anything more being released (a unit waits only on earlier
units, all released, and its turn was numbered when its period was); so once they are
done no worker has anything left to start until ``advance()`` releases the next period.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, List, Optional, Union

from ..plan import ordering
from . import paper
from .pipeline import _PipelineBase
from ..devices.device import DeviceSpec
from ..plan.model import PipelinePlan
from ..observe.records import PathLike
from .release import ClockRule
from .runtime import TaskSpec
from ..observe.tables import ScheduleRow, format_period_table, format_stage_analysis

if TYPE_CHECKING:
    from ..analysis.report import PlanAnalysis  # free_early=analyze(...): a type the engine never imports

__all__: List[str] = []


class SWPipeline(_PipelineBase):
    """Clock-driven software pipeline: ``depth = max(stage) + 1`` iterations in flight.

    Args:
        plan: the PipelinePlan; its stages must follow the stage rules (an intra-iteration
            dependency is at the same or an earlier stage; an inter-iteration one at distance d at most
            d stages later).
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
        super().__init__(plan, ClockRule, device, signal_timeout=signal_timeout,
                         progress_timeout=progress_timeout, join_timeout=join_timeout, worker_init=worker_init,
                         check_races=check_races, free_early=free_early, keep=keep,
                         caller_thread_group=caller_thread_group)
        self.depth: int = self.plan.depth
        callers = dict.fromkeys([None, self._run_caller_group, self._fill_caller_group])  # every way it can run
        for caller_group in callers:
            for num_batches in sorted({1, self.depth, 2 * self.depth + 1}):
                paper.check(self._schedule, self._rule, num_batches, caller_group)
        self._enqueue_order = [self._by_name[s.task] for s in self._schedule.slots]

    # -- inspection ---------------------------------------------------------------------------

    def format_schedule(self, num_periods: int) -> str:
        """The period x task table as a string: a row per task, in the order each period submits them.

        That is the last stage first (a period runs its oldest iteration's work first), then dependency order
        within a stage. Columns: thread group, stream, and per period the iteration the task works on (``--``
        before its first; ``.`` for a shortcut task, whose results are replayed).
        """
        return format_period_table(self._schedule_rows(num_periods), num_periods)

    def _schedule_rows(self, num_periods: int) -> List[ScheduleRow]:
        if isinstance(num_periods, bool) or not isinstance(num_periods, int) or num_periods < 1:
            raise ValueError(f"num_periods must be a positive int, got {num_periods!r}")
        rows: List[ScheduleRow] = []
        for slot, cells in self._schedule.cells(num_periods):
            if self._shortcut.is_shortcut(slot.task):  # a shortcut task replays its cache
                cells = ["." if c != "--" else c for c in cells]
            rows.append((self._shortcut.label(slot.task), slot.group, slot.stream, cells))
        return rows

    def print_schedule(self, num_periods: int) -> None:
        """Print ``format_schedule(num_periods)``: a row per task, the last stage first, as each period runs them."""
        print(self.format_schedule(num_periods))

    def save_schedule_chart(self, path: PathLike, num_periods: int) -> None:
        """Draw the ``print_schedule`` table as a PNG picture, cells coloured by iteration (needs matplotlib)."""
        from ..observe.charts import save_period_table

        save_period_table(self._schedule_rows(num_periods), path,
                          title=f"SWPipeline schedule: depth {self.depth}, {num_periods} periods")

    def format_stage_analysis(self) -> str:
        """Tasks in serial order with their stage, and the LDS check: the longest chain of dependent tasks whose
        stages strictly increase, against the depth (equal: every stage boundary separates a producer from a
        consumer that needs it)."""
        position = {t.name: k for k, t in enumerate(self._enqueue_order)}
        rows = [(self._shortcut.label(t.name), position[t.name], t.stage, self._task_type(t))
                for t in self._serial_order]
        chain = [(n, self.plan.stage(n)) for n in ordering.longest_stage_chain(self.plan)]
        return format_stage_analysis(rows, chain, self.depth)

    def print_stage_analysis(self) -> None:
        """Print ``format_stage_analysis()``."""
        print(self.format_stage_analysis())

    def _task_type(self, task: TaskSpec) -> str:
        return "skip" if self._shortcut.is_shortcut(task.name) else "stream"

    @property
    def enqueue_order(self) -> List[str]:
        """The order in which one period's tasks are submitted."""
        return [t.name for t in self._enqueue_order]

    def __repr__(self) -> str:
        head = (f"SWPipeline(device={self._device_text()}, depth={self.depth}, tasks={self.plan.task_names}, "
                f"shortcuts={self.shortcuts})")
        return f"{head}\n\n{self.format_schedule(self.depth)}"
