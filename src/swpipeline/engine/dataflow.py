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

What a unit waits for, when it is handed out, the steps without a batch
(``progress(None)``, ``drain()``), the caller's thread group and why none of it can
deadlock are written once for both engines: the release rule in ``release.py``
(``DataFlowRule``), the hand-out and the deadlock argument in ``handout.py``. A smaller
``max_depth`` than the depth is accepted only if ``paper.check`` runs the plan to the
end with it.

The step boundary (``progress(advance=False)``, see ``pipeline.py``) waits for the units handed
out that do not wait, directly or through others, on a unit not handed out
(``paper.boundary`` finds them on paper: they are what runs if nothing more is handed
out, whatever the timing). That includes later iterations' units the engine ran ahead
on, within the live contexts; the caller's group has run the oldest iteration's last
period (a held step runs the whole of it) and runs nothing in between.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable, Iterable, List, Optional, Union

from .pipeline import _PipelineBase
from ..devices.device import DeviceSpec
from ..plan.model import PipelinePlan
from .release import DataFlowRule
from .paper import ScheduleError, check

if TYPE_CHECKING:
    from ..analysis.report import PlanAnalysis  # free_early=analyze(...): a type the engine never imports

__all__: List[str] = []


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
        super().__init__(plan, functools.partial(DataFlowRule, max_live=max_depth), device,
                         signal_timeout=signal_timeout, progress_timeout=progress_timeout, join_timeout=join_timeout,
                         worker_init=worker_init, check_races=check_races,
                         free_early=free_early, keep=keep, caller_thread_group=caller_thread_group)
        self._check_max_depth()

    def _check_max_depth(self) -> None:
        depth, max_depth = self._schedule.depth, self.max_depth
        callers = list(dict.fromkeys([None, self._run_caller_group, self._fill_caller_group]))  # every way it can run

        def runs(live: int) -> Optional[ScheduleError]:
            try:
                for caller_group in callers if live >= depth else [None]:
                    for num_batches in sorted({1, depth, 2 * depth + live + 1}):
                        check(self._schedule, DataFlowRule(depth, live), num_batches, caller_group)
            except ScheduleError as stuck:
                return stuck
            return None

        stuck = runs(max_depth)
        if stuck is not None and max_depth >= depth:
            raise stuck  # a bug in the ordering: any max_depth >= depth always completes
        if stuck is not None:
            need = next(live for live in range(max_depth + 1, depth + 1) if runs(live) is None)
            raise ValueError(
                f"max_depth={max_depth} is too small for this plan: each thread group runs its units in the order "
                f"SWPipeline runs them (on a stream, older iterations first; the stages set how iterations "
                f"interleave), and that order needs {need} iterations alive at once ({stuck.blocked}); use "
                f"max_depth >= {need}, or lower the stages"
            )

    # -- inspection ---------------------------------------------------------------------------

    def __repr__(self) -> str:
        deps = {t.name: self.plan.intra[t.name] for t in self._serial_order}
        return (f"DataFlowPipeline(device={self._device_text()}, max_depth={self.max_depth}, "
                f"tasks={[t.name for t in self._serial_order]}, shortcuts={self.shortcuts}, "
                f"intra_iter_deps={deps}, inter_iter_deps={self.plan.inter_entries()})")
