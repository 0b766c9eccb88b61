"""SWPipeline: the clock-driven engine.

Each ``progress()`` is one clock tick: retire the oldest iteration, then enqueue
one *period*, in which every task runs once, on iteration ``period - stage``::

    fill_pipeline():  enqueue P0 .. P{depth-1}              (iterations 0 .. depth-1 enter)
    progress() #k:    retire iteration k, enqueue P{depth+k}  (iteration depth+k enters)

    depth 3      P0   P1   P2   P3   P4
    stage 2      --   --   i0   i1   i2      <- retire i0 before enqueuing P3
    stage 1      --   i0   i1   i2   i3
    stage 0      i0   i1   i2   i3   i4

Inside a period tasks are enqueued in the ready-first order (``ordering.enqueue_order``);
each thread group receives its share of a period as one queue item, in that order.
Why this cannot deadlock: order all work units by (period, position in the enqueue
order). Every dependency a unit waits on is strictly earlier in that order (an
earlier period, or the same period and earlier in the topological enqueue order,
by Corollaries 1 and 3), each worker's queue is FIFO in that order, and the
sequencer's turns follow it too; so the earliest unfinished unit never waits.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Optional

from . import ordering
from .base import _PipelineBase
from .device import DeviceSpec
from .plan import IterContext, PipelinePlan
from .runtime import TaskRuntime
from .tables import ScheduleRow, format_period_table, format_stage_analysis
from .timeline import PathLike

__all__: List[str] = []


class SWPipeline(_PipelineBase):
    """Clock-driven software pipeline: ``depth = max(stage) + 1`` iterations in flight.

    Args:
        plan: the PipelinePlan; stages must satisfy Corollaries 1 and 3.
        device: None (current accelerator, else CPU), an index, ``"cpu"``, ``"cuda:1"``,
            a torch.device, or a Device instance (e.g. ``SimulatedDevice()`` in tests).
        signal_timeout: seconds a task may wait for one dependency (default 30).
        progress_timeout: seconds progress() may wait for the oldest iteration (default 60).
        worker_init: called as ``worker_init(thread_group)`` at the start of each worker thread
            (e.g. to pin a compute thread to a core); an exception fails the pipeline.
        caller_thread_group: a thread group whose tasks run on the thread that calls
            ``progress()`` (each call first runs what was queued for it) instead of on a worker
            thread: no hand-off at all for that group. The order and deadlock argument are the
            same as for a worker; ``worker_init`` is not called for it.

    Raises:
        TypeError, ValueError: the plan breaks a stage rule or an argument is invalid.
    """

    def __init__(self, plan: PipelinePlan, device: DeviceSpec = None, *, signal_timeout: float = 30.0,
                 progress_timeout: float = 60.0, worker_init: Optional[Callable[[str], None]] = None,
                 caller_thread_group: Optional[str] = None) -> None:
        if not isinstance(plan, PipelinePlan):
            raise TypeError(f"plan must be a PipelinePlan, got {type(plan).__name__}")
        ordering.validate_stages(plan)
        self.depth: int = plan.depth
        super().__init__(plan, self.depth, device, signal_timeout=signal_timeout,
                         progress_timeout=progress_timeout, worker_init=worker_init)
        if caller_thread_group is not None and caller_thread_group not in self._groups:
            raise ValueError(f"caller_thread_group={caller_thread_group!r} is not a thread group of the plan "
                             f"(its groups: {self._groups})")
        self._caller_group = caller_thread_group
        streams = {t.name: t.stream for t in self._tasks}
        self._enqueue_order = [self._by_name[n] for n in ordering.enqueue_order(plan, streams)]

    def _reset_state(self) -> None:
        super()._reset_state()
        self._period = 0
        self._next_seq = 0
        self._starting: Dict[int, IterContext] = {}  # period -> the iteration that entered in it
        self._start_period: Dict[int, int] = {}  # iteration -> the period it entered in

    # -- scheduling ---------------------------------------------------------------------------

    def _do_fill(self, data_iter: Iterator[Any]) -> None:
        for _ in range(self.depth):
            self._enqueue_period(data_iter)

    def _do_retire(self, oldest: int, data_iter: Optional[Iterator[Any]]) -> None:
        self._start_period.pop(oldest)
        self._enqueue_period(data_iter)
        # After progress(None) the clock ran without a new batch; make sure the next
        # iteration to retire has all its stages enqueued before anyone waits for it.
        nxt = self._start_period.get(oldest + 1)
        while nxt is not None and self._period < nxt + self.depth:
            self._enqueue_period(None)

    def _enqueue_period(self, data_iter: Optional[Iterator[Any]]) -> None:
        """Fetch the batch entering this period (if any), then hand every task's unit to its worker."""
        period = self._period
        self._period = period + 1
        ctx = self._fetch(data_iter)
        if ctx is not None:
            self._starting[period] = ctx
            self._start_period[ctx.iter_idx] = period
        starting = self._starting
        per_group: Dict[str, List[Any]] = {}
        for task in self._enqueue_order:
            entering = starting.get(period - task.stage)
            if entering is None:
                continue
            seq = -1
            if task.globally_ordered:
                seq = self._next_seq
                self._next_seq = seq + 1
                self._sequencer.announce(seq, task.name)
            units = per_group.get(task.group)
            if units is None:
                units = per_group[task.group] = []
            units.append((task, entering, seq))
        starting.pop(period - self.depth + 1, None)
        workers = self._workers
        for group, units in per_group.items():
            workers[group].put(units)

    def _unit_period(self, task: TaskRuntime, ctx: IterContext) -> Optional[int]:
        entered = self._start_period.get(ctx.iter_idx)  # popped when the iteration retires
        return None if entered is None else entered + task.stage

    # -- inspection ---------------------------------------------------------------------------

    def format_schedule(self, num_periods: int) -> str:
        """The period x task table as a string (rows stage-descending, topological within a stage)."""
        return format_period_table(self._schedule_rows(num_periods), num_periods)

    def _schedule_rows(self, num_periods: int) -> List[ScheduleRow]:
        if isinstance(num_periods, bool) or not isinstance(num_periods, int) or num_periods < 1:
            raise ValueError(f"num_periods must be a positive int, got {num_periods!r}")
        rows: List[ScheduleRow] = []
        for name in ordering.schedule_rows(self.plan):
            task = self._by_name[name]
            runs = "." if task.name in self._shortcuts.enabled else None  # a shortcut task replays its cache
            cells = [(runs or f"i{p - task.stage}") if p >= task.stage else "--" for p in range(num_periods)]
            rows.append((self._label(task), task.group, task.stream_label, cells))
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
        """Tasks in serial order with their stage, and the LDS check (see ``ordering.longest_stage_chain``)."""
        position = {t.name: k for k, t in enumerate(self._enqueue_order)}
        rows = [(self._label(t), position[t.name], t.stage, self._task_type(t)) for t in self._serial_order]
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
        head = (f"SWPipeline(device={self.device}, depth={self.depth}, tasks={self.plan.task_names}, "
                f"shortcuts={self.shortcuts})")
        return f"{head}\n\n{self.format_schedule(self.depth)}"
