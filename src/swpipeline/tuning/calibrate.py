"""``calibrate``: measure the engine's own costs (``EngineOverheads``) on this machine.

Two small probe pipelines run traced (``run(trace=True)``), and the constants are
read off their timelines as medians over hundreds of units, so that a moment of
load elsewhere on the machine does not move them much::

    hop      A (thread a, sleeps 0.3 ms) -> B (thread b, no-op), depth 1
             wake   = start of B(i) - end of A(i)             B was waiting for A
             caller = start of A(i+1) - end of B(i) - 2 wake - unit
                      (the caller wakes, retires i, hands out the next period; a wakes)
    many     16 no-op tasks on one thread, depth 1
             unit   = start of a task - end of the one before it on the thread

``caller`` is split 2:1 between ``period`` and ``retire``. ``run()`` of one batch with
one and with four thread groups gives the cost of starting and stopping a thread.
Timings taken on a busy machine are not to be trusted, nor constants measured on one.
"""

from __future__ import annotations

import statistics
import time
from typing import List, Sequence, Tuple

from .overheads import EngineOverheads
from ..plan.context import IterContext
from ..plan.model import PipelinePlan, PipelineTask, TaskSchedule

__all__: List[str] = []

PROBE_SLEEP = 0.3e-3


def _noop(ctx: IterContext) -> None:
    """A task that does nothing."""


def _sleep(ctx: IterContext) -> None:
    time.sleep(PROBE_SLEEP)


def _plan(layout: Sequence[Tuple[str, int, str]], chain: bool, first_sleeps: bool = False) -> PipelinePlan:
    """No-op tasks ``(name, stage, thread group)``, each on its group's stream; ``chain``: each after the last."""
    schedule = {PipelineTask(name, _sleep if first_sleeps and k == 0 else _noop):
                TaskSchedule(stage=stage, stream=group, thread_group=group)
                for k, (name, stage, group) in enumerate(layout)}
    deps = [(layout[k][0], layout[k - 1][0]) for k in range(1, len(layout))] if chain else []
    return PipelinePlan(schedule, intra_iter_deps=deps)


def calibrate(iterations: int = 300) -> EngineOverheads:
    """Measure the engine's own costs on this machine (takes about half a second).

    Args:
        iterations: batches per probe run.

    Returns:
        EngineOverheads: the measured constants (each at least 0).

    Raises:
        ValueError: ``iterations`` below 20.
    """
    from ..engine.clocked import SWPipeline

    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 20:
        raise ValueError(f"calibrate: iterations must be an int >= 20, got {iterations!r}")
    hop = SWPipeline(_plan([("A", 0, "a"), ("B", 0, "b")], True, first_sleeps=True), device="cpu")
    hop.run(range(iterations), trace=True)
    timeline = hop.timeline
    many = SWPipeline(_plan([(f"T{j}", 0, "g") for j in range(16)], False), device="cpu")
    many.run(range(iterations // 4), trace=True)
    if timeline is None or many.timeline is None:  # unreachable: both runs were traced
        raise RuntimeError("calibrate: a probe run recorded no timeline")
    a, b = timeline.for_task("A"), timeline.for_task("B")
    wake = max(0.0, statistics.median(y.cpu_start - x.cpu_end for x, y in zip(a, b)))
    records = sorted(many.timeline.records, key=lambda r: r.cpu_start)
    unit = max(0.0, statistics.median(y.cpu_start - x.cpu_end for x, y in zip(records, records[1:])
                                      if x.iteration == y.iteration))
    round_trip = statistics.median(a[k + 1].cpu_start - b[k].cpu_end for k in range(len(a) - 1))
    caller = max(0.0, round_trip - 2 * wake - unit)
    one_group = _run_once(_plan([("A", 0, "g0")], False))
    four_groups = _run_once(_plan([(f"A{j}", 0, f"g{j}") for j in range(4)], False))
    per_thread = max(0.0, (four_groups - one_group) / 3)
    return EngineOverheads(wake=wake, unit=unit, period=caller * 2 / 3, retire=caller / 3,
                           thread_start=per_thread * 0.6, thread_stop=per_thread * 0.4)


def _run_once(plan: PipelinePlan, repeats: int = 9) -> float:
    """The median wall time of ``run()`` on a single batch (threads started and stopped each time)."""
    from ..engine.clocked import SWPipeline

    pipe = SWPipeline(plan, device="cpu")
    pipe.run(range(1))
    return statistics.median(pipe.run(range(1)) for _ in range(repeats))
