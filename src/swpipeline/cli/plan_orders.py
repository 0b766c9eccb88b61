"""What ``swpipeline plan`` says about the orders the traced placement gave: kept, dropped, worth dropping.

A trace shows where each task ran, not what it touches, so it cannot tell which of the
orders the placement gave (two tasks on one thread or stream run in a fixed order) the
tasks need. The suggestion keeps them all but those ``--drop-order`` names; these texts
say what it kept and dropped, what a plan that drops more would gain, and, with
``--weight-versions FORWARD,STEP``, the staleness trade-off: the exact plan beside the one
``WeightVersions`` makes exact with the forward overlapping the steps before it.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from ..analysis.races import Placement
from ..plan.model import PipelinePlan
from ..tuning.kept_orders import Order, grouped_text, order_text, orders_dropped
from ..tuning.plan_report import format_comparison, format_plan
from ..tuning.search_result import PlanSearch
from ..tuning.sim_result import SimResult
from ..tuning.staleness import WeightVersionsPlan

__all__: List[str] = []

TOLERANCE = 0.005  # a plan faster by less is not worth naming
RACES = ("where one of two such tasks writes what the other reads or writes (weights, gradients, a learning rate, "
         "a buffer), a plan that drops their order races")


def flag(order: Order) -> str:
    """``Forward,Step,inter``: an order as ``--drop-order`` and ``--keep-order`` take it."""
    return f"{order[0]},{order[1]},{'inter' if order[2] else 'intra'}"


def _listed(traced: PipelinePlan, orders: Sequence[Order]) -> List[str]:
    """The orders grouped by what comes first, each group with where the two tasks ran."""
    where = Placement(traced)
    by_place: Dict[Optional[str], List[Order]] = {}
    for order in orders:
        by_place.setdefault(where.shared(order[0], order[1]), []).append(order)
    return [f"  - {text}; they ran on {shared}" for shared, group in by_place.items()
            for text in grouped_text(group)]


def format_kept(traced: PipelinePlan, search: PlanSearch) -> str:
    """What the suggestion kept of the orders the traced placement gave ('' where it gave none)."""
    given = len(search.kept_orders) + len(search.dropped_orders)
    if not given:
        return ""
    dropped = orders_dropped(search.plan, search.dropped_orders)
    if not dropped:
        also = " (those --drop-order names too: its placement keeps them)" if search.dropped_orders else ""
        return (f"the suggestion keeps every order the traced run got from its placement alone ({given}){also}: "
                f"tasks on one thread or stream run in a fixed order, and a trace cannot tell which of these orders "
                f"the tasks need")
    lines = [f"the suggestion drops {len(dropped)} of the {given} orders the traced run got from its placement alone, "
             f"as --drop-order asks:", *_listed(traced, dropped), f"{RACES}: drop only orders nothing needs"]
    return "\n".join(lines)


def format_faster(traced: PipelinePlan, search: PlanSearch, speedup: float, free: PlanSearch, free_speedup: float,
                  weight_versions: bool) -> str:
    """A plan that drops more of the orders, where it is predicted faster than the suggestion ('' otherwise)."""
    dropped = orders_dropped(free.plan, search.kept_orders)
    if not dropped or free.result.seconds * (1 + TOLERANCE) >= search.result.seconds:
        return ""
    these = "more of them" if search.dropped_orders else "these of them"
    lines = [f"a plan predicted {free_speedup:.2f}x as fast as the traced one (the suggestion: {speedup:.2f}x) drops "
             f"{these} ({len(dropped)}):", *_listed(traced, dropped),
             f"{RACES}, and a trace cannot tell. To search without those nothing needs, run again with "
             f"--drop-order for each: {' '.join(f'--drop-order {flag(o)}' for o in dropped)}"]
    if not weight_versions and any(distance for _, _, distance in dropped):
        lines.append("where one of them is a forward after the optimizer step that updates its weights, dropping it "
                     "trains on weights one step old or current, by timing: --weight-versions FORWARD,STEP shows the "
                     "plan WeightVersions makes exact beside the exact one")
    return "\n".join(lines)


def format_tradeoff(traced: PipelinePlan, traced_result: SimResult, exact: PipelinePlan, exact_result: SimResult,
                    choice: WeightVersionsPlan, choice_result: Optional[SimResult]) -> str:
    """The exact plan beside the WeightVersions one, with their predicted speeds (or why there is none)."""
    forward, step, k = choice.forward, choice.step, choice.staleness
    head = f"the staleness trade-off (--weight-versions {forward},{step}):"
    if choice.search is None or choice_result is None:
        if not choice.waits:
            return (f"{head} the plan's dependencies run {forward}(i+1) after {step}(i) through other tasks, so "
                    f"WeightVersions cannot let them overlap")
        return (f"{head} the orders kept still run {forward}(i+1) after {step}(i) "
                f"({', '.join(order_text(o) for o in choice.waits)}), so {forward} cannot overlap {step} even with "
                f"WeightVersions; where nothing needs them, run again with "
                f"{' '.join(f'--drop-order {flag(o)}' for o in choice.waits)}")
    dependency = choice.dependency
    lines = [f"{head} the exact plan keeps {forward}(i+1) after {step}(i), as the serial loop runs; with "
             f"WeightVersions, {forward}(i) computes on the weights after {step}(i-{k + 1}) (staleness {k}), one "
             f"version per iteration, the same in every run and on both engines", "",
             format_comparison(["traced plan", "exact", f"WeightVersions, staleness {k}"],
                               [traced, exact, choice.search.plan], [traced_result, exact_result, choice_result],
                               speedup_over=0), "",
             f"the WeightVersions plan: versions = swpipeline.WeightVersions(model, staleness={k}), the model run "
             f"under `with versions.use(ctx):` in {forward}, versions.step(ctx, optimizer) in {step}, and "
             f"versions.deps({forward}, {step}), which is (\"{dependency[0]}\", \"{dependency[1]}\", {dependency[2]}), "
             f"in inter_iter_deps:", format_plan(choice.search.plan)]
    if choice_result.seconds * (1 + TOLERANCE) >= exact_result.seconds:
        lines.append("it is predicted no faster than the exact plan: keep the exact one")
    return "\n".join(lines)

