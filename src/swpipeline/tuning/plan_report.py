"""Text reports of plans: a plan's schedule table, and plans' predictions side by side (suggestion vs baseline)."""

from __future__ import annotations

from typing import List, Optional, Sequence

from ..plan.model import PipelinePlan
from .sim_result import SimResult
from ..observe.tables import text_table as _table

__all__: List[str] = []


def format_plan(plan: PipelinePlan) -> str:
    """A plan as a table: each task's stage, thread group and stream, then its dependencies."""
    rows = []
    for name in plan.task_names:
        s = plan.schedules[name]
        stream = "default" if s.stream is None else str(s.stream)
        rows.append([name, s.thread_group, stream, str(s.stage), "yes" if s.globally_ordered else ""])
    lines = _table(["task", "thread", "stream", "stage", "globally ordered"], rows, left=3)
    lines = [line.rstrip() for line in lines]
    intra = [f"{t} <- {d}" for t in plan.task_names for d in plan.intra[t]]
    inter = [f"{t} <- {d}(i-{back})" for t in plan.task_names for d, back in plan.inter[t]]
    if intra or inter:
        lines.append("dependencies: " + ", ".join(intra + inter))
    return "\n".join(lines)


def _shape(plan: PipelinePlan) -> List[int]:
    groups = {s.thread_group for s in plan.schedules.values()}
    streams = {str(s.stream) for s in plan.schedules.values()}
    return [plan.depth, len(groups), len(streams)]


def _column(plan: PipelinePlan, result: SimResult) -> List[str]:
    depth, groups, streams = _shape(plan)
    return [f"{result.seconds_per_iteration * 1e3:.3f}", f"{result.steady_seconds_per_iteration * 1e3:.3f}",
            f"{result.throughput:.1f}", str(result.peak_live_contexts), str(depth), str(groups), str(streams),
            result.bottleneck]


ROWS = ["ms/iteration (whole run)", "ms/iteration (steady)", "iterations/s", "live contexts (peak)", "depth",
        "thread groups", "streams", "critical path mostly"]


def format_comparison(columns: Sequence[str], plans: Sequence[PipelinePlan], results: Sequence[SimResult],
                      speedup_over: Optional[int] = None) -> str:
    """Side-by-side predictions of several plans (one column each)."""
    values = [_column(p, r) for p, r in zip(plans, results)]
    rows = [[label] + [v[k] for v in values] for k, label in enumerate(ROWS)]
    if speedup_over is not None:
        base = results[speedup_over].seconds
        rows.append(["predicted speedup"] + [f"{base / r.seconds:.2f}x" for r in results])
    return "\n".join(_table(["", *columns], rows, left=1))
