"""DataFlowPipeline: the data-flow engine. A task fires as soon as it can; no clock, no stages.

A unit ``(task, i)`` is handed to its worker once all of these hold (under one lock):

1. it is the task's next iteration (each task fires its iterations in order, so
   the CPU signals stay per-task counters, see ``signals.py``);
2. fewer than ``max_depth`` units of the task are in flight;
3. iteration ``i`` has a context (its batch was fetched and it is not retired);
4. every intra dependency is done for ``i``;
5. every inter dependency is done for ``i - 1``;
6. (globally ordered tasks only) every globally ordered unit before it in the
   fixed sequence (iteration-major, then serial task order) has fired.

Contexts are created eagerly, up to ``max_depth`` live at once: dependency-free
tasks such as a copy burst ahead of the bottleneck and buffer its jitter::

    max_depth 3   t0    t1    t2    t3    t4
    Copy          0 1 2       3     4           <- bursts while slots are free
    Compute       0     1     2     3           <- the bottleneck, never starved

Why it cannot deadlock: a unit fires only when its dependencies are *done*, so
no worker ever blocks on a CPU signal; globally ordered units fire in sequence
order, so the one with the smallest pending number is at the front of its FIFO
queue or behind units that never block. The buffer is bounded (``max_depth``
contexts), and the oldest context always has every task fireable in topological
order, so retirement, and with it a free slot, always comes.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

from .base import _PipelineBase
from .device import DeviceSpec
from .plan import PipelinePlan
from .runtime import TaskRuntime

__all__: List[str] = []


class DataFlowPipeline(_PipelineBase):
    """Data-flow software pipeline: at most ``max_depth`` iterations in flight; stages are ignored.

    Args:
        plan: the PipelinePlan (``TaskSchedule.stage`` is ignored).
        max_depth: the most iterations alive at once (>= 1); 1 behaves like a serial run.
        device, signal_timeout, progress_timeout, worker_init: as for ``SWPipeline``.
    """

    def __init__(self, plan: PipelinePlan, max_depth: int = 2, device: DeviceSpec = None, *,
                 signal_timeout: float = 30.0, progress_timeout: float = 60.0,
                 worker_init: Optional[Callable[[str], None]] = None) -> None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
            raise ValueError(f"max_depth must be an int >= 1 (the most iterations in flight), got {max_depth!r}")
        self.max_depth = max_depth
        super().__init__(plan, max_depth, device, signal_timeout=signal_timeout, progress_timeout=progress_timeout,
                         worker_init=worker_init)
        self._fire_lock = threading.Lock()
        self._downstream: Dict[int, List[TaskRuntime]] = {t.index: [] for t in self._tasks}
        for task in self._tasks:
            for dep in set(self.plan.intra[task.name]) | set(self.plan.inter[task.name]):
                self._downstream[self._by_name[dep].index].append(task)
        self._ordered = [t for t in self._serial_order if t.globally_ordered]
        self._ordered_rank = {t.index: k for k, t in enumerate(self._ordered)}

    def _reset_state(self) -> None:
        super()._reset_state()
        self._next_fire = [0] * len(self._tasks)
        self._pending = [0] * len(self._tasks)
        self._next_ordered = 0  # number of globally ordered units fired so far

    # -- scheduling ---------------------------------------------------------------------------

    def _do_fill(self, data_iter: Iterator[Any]) -> None:
        self._advance(data_iter)

    def _do_retire(self, oldest: int, data_iter: Optional[Iterator[Any]]) -> None:
        self._advance(data_iter)
        with self._fire_lock:
            self._pump(self._serial_order)

    def _advance(self, data_iter: Optional[Iterator[Any]]) -> None:
        """Fetch batches while fewer than max_depth iterations are alive; fire what becomes ready."""
        while len(self._contexts) < self.max_depth:
            if self._fetch(data_iter) is None:
                return
            with self._fire_lock:
                self._pump(self._serial_order)

    def _after_task_complete(self, task: TaskRuntime, iter_idx: int) -> None:
        with self._fire_lock:
            self._pending[task.index] -= 1
            self._pump([task] + self._downstream[task.index])

    def _pump(self, candidates: Iterable[TaskRuntime]) -> None:
        """Fire every unit that became ready, following the consequences of each fire (lock held)."""
        work = list(candidates)
        while work:
            task = work.pop()
            if self._try_fire(task):
                work.append(task)  # its next iteration may be ready too
                if task.globally_ordered and self._ordered:
                    work.append(self._ordered[self._next_ordered % len(self._ordered)])

    def _try_fire(self, task: TaskRuntime) -> bool:
        i = self._next_fire[task.index]
        worker = self._workers.get(task.group)
        if worker is None or self._pending[task.index] >= self.max_depth:
            return False  # (no worker: the pipeline is stopping)
        ctx = self._contexts.get(i)
        if ctx is None:
            return False
        done = self._board.done
        if any(done[d] <= i for d, _ in task.intra):
            return False
        if i > 0 and any(done[d] < i for d, _ in task.inter):
            return False
        seq = -1
        if task.globally_ordered:
            seq = i * len(self._ordered) + self._ordered_rank[task.index]
            if seq != self._next_ordered:
                return False
            self._next_ordered = seq + 1
            self._sequencer.announce(seq, task.name)
        self._next_fire[task.index] = i + 1
        self._pending[task.index] += 1
        worker.put(((task, ctx, seq),))
        return True

    # -- inspection ---------------------------------------------------------------------------

    def __repr__(self) -> str:
        deps = {t.name: self.plan.intra[t.name] for t in self._serial_order}
        return (f"DataFlowPipeline(device={self.device}, max_depth={self.max_depth}, "
                f"tasks={[t.name for t in self._serial_order]}, shortcuts={self.shortcuts}, "
                f"intra_iter_deps={deps}, inter_iter_deps={ {k: v for k, v in self.plan.inter.items() if v} })")

