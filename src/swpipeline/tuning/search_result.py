"""``PlanSearch``: what ``search_plan`` found, and its text report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from ..plan.model import PipelinePlan
from .kept_orders import Order, grouped_text
from .plan_report import format_comparison, format_plan
from .sim_result import SimResult

__all__: List[str] = []


@dataclass(frozen=True)
class PlanSearch:
    """What ``autoplan`` found (``search_plan`` returns it; ``autoplan`` returns its ``plan``).

    Attributes:
        plan: the suggested plan.
        result: its simulation.
        engine, max_in_flight: as asked.
        exhaustive: whether every candidate was considered (else the local search ran).
        candidates: how many candidates the space holds.
        simulated: how many were simulated.
        baseline, baseline_result: the plan to compare with, and its simulation, if one was given.
        kept_baseline: no plan was predicted faster than the baseline by more than ``tolerance``,
            so ``plan`` is the baseline itself (or, where it does not keep every order of
            ``keep_orders``, its placement with those orders declared).
        kept_orders: the orders of the baseline's placement that the suggestion keeps, as
            ``(task, depends_on, distance)`` (``task(i)`` after ``depends_on(i - distance)``): every
            one the dependencies (with ``keep_orders``) do not give, less ``dropped_orders``.
        dropped_orders: the orders of the baseline's placement dropped as asked (``drop_orders``).
    """

    plan: PipelinePlan
    result: SimResult
    engine: str
    max_in_flight: int
    exhaustive: bool
    candidates: int
    simulated: int
    baseline: Optional[PipelinePlan] = None
    baseline_result: Optional[SimResult] = None
    kept_baseline: bool = False
    kept_orders: Tuple[Order, ...] = ()
    dropped_orders: Tuple[Order, ...] = ()

    @property
    def speedup(self) -> Optional[float]:
        """The baseline's predicted time over the suggestion's (None without a baseline)."""
        if self.baseline_result is None:
            return None
        return self.baseline_result.seconds / self.result.seconds

    def format_report(self) -> str:
        """The suggestion as text: how it was found, its schedule, and the comparison with the baseline."""
        how = "exhaustive search" if self.exhaustive else "local search (the space is too large to try every plan)"
        lines = [f"autoplan: {self.engine} engine, at most {self.max_in_flight} iterations alive; "
                 f"{self.simulated} of {self.candidates:,} candidate plans simulated ({how}), "
                 f"{self.result.num_iterations} iterations each", ""]
        if self.baseline is not None and self.baseline_result is not None:
            lines.append(format_comparison(["baseline", "suggested"], [self.baseline, self.plan],
                                           [self.baseline_result, self.result], speedup_over=0))
        else:
            lines.append(format_comparison(["suggested"], [self.plan], [self.result]))
        if self.kept_baseline:
            lines += ["", "no plan is predicted faster than the baseline by more than the tolerance: keep it"]
        given = len(self.kept_orders) + len(self.dropped_orders)
        if self.baseline is not None and given:
            lines += ["", f"orders of the baseline's placement kept: {len(self.kept_orders)} of {given}" +
                      (f", {len(self.dropped_orders)} dropped as asked:" if self.dropped_orders else "")]
            lines += [f"  - {text}" for text in grouped_text(self.dropped_orders)]
        lines += ["", "suggested plan:", format_plan(self.plan), "", self.result.format()]
        return "\n".join(lines)

    def print_report(self) -> None:
        """Print ``format_report()``."""
        print(self.format_report())
