"""The staleness trade-off: a plan that lets a forward overlap the optimizer step before it, made exact.

A faster plan may need ``Forward(i+1)`` to start before ``Step(i)`` has updated the weights
it reads. Dropping that order makes the run train on weights one step old or current, by
timing. ``WeightVersions`` makes the overlap exact: with staleness ``k`` the forward of
iteration ``i`` computes on the weights after the step of iteration ``i - k - 1``, which
``versions.deps(forward, step) == (forward, step, k + 1)`` in ``inter_iter_deps`` waits for::

    exact               Forward(i+1) after Step(i)          the serial loop's answer
    staleness k         Forward(i+1) after Step(i - k)      WeightVersions(model, staleness=k)

``weight_versions_search`` searches that plan: the baseline's placement orders are kept as
``search_plan`` keeps them, but for those between the tasks from the forward to the step
(the forward, the step and every task between them in an iteration), whose state the
versions keep apart (each iteration's weights and gradients), and ``Forward(i+1) after
Step(i)`` itself, declared or not, which ``(forward, step, k + 1)`` replaces. Another order
kept that still runs the forward after the step (``Load(i+1) after Step(i)`` where ``Load``
comes before ``Forward``) is named, not dropped: only the user can say nothing needs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..analysis.races import HappensBefore
from ..plan.model import PipelinePlan
from .autoplan import search_plan
from .kept_orders import Order, keep_placement, orders_to_drop_too, with_orders
from .search_result import PlanSearch

__all__: List[str] = []

Pair = Tuple[str, str]


@dataclass(frozen=True)
class WeightVersionsPlan:
    """The fastest WeightVersions plan found (``search`` None where ``waits`` keeps the forward after the step).

    Attributes:
        forward, step: the forward that reads the weights, and the optimizer step that updates them.
        staleness: ``k``: the forward of iteration ``i`` computes on the weights after the step of ``i - k - 1``.
        dependency: ``versions.deps(forward, step)``, ``(forward, step, k + 1)``, for ``inter_iter_deps``.
        search: the search with that dependency.
        waits: the orders kept that still run ``forward(i+1)`` after ``step(i)`` (then ``search`` is None).
    """

    forward: str
    step: str
    staleness: int
    dependency: Tuple[str, str, int]
    search: Optional[PlanSearch]
    waits: Tuple[Order, ...] = ()


def chain_between(names: Sequence[str], intra: Sequence[Pair], forward: str, step: str) -> List[str]:
    """The tasks from ``forward`` to ``step`` in an iteration: both, and every task after one and before the other."""
    relation = HappensBefore(names, _intra_map(names, intra), {})
    return [n for n in names
            if (n == forward or relation.before(forward, n)) and (n == step or relation.before(n, step))]


def check_pair(names: Sequence[str], intra: Sequence[Pair], forward: str, step: str, where: str) -> None:
    """ValueError (starting with ``where``) unless ``forward`` runs before ``step`` in an iteration."""
    for name in (forward, step):
        if name not in names:
            raise ValueError(f"{where}: no task {name!r} (the tasks: {', '.join(names)})")
    if not HappensBefore(names, _intra_map(names, intra), {}).before(forward, step):
        raise ValueError(f"{where}: {forward} does not run before {step} in an iteration (no chain of intra-iteration "
                         f"dependencies leads from {forward} to {step}); name the forward that reads the weights "
                         f"first, then the optimizer step that updates them")


def weight_versions_search(baseline: PipelinePlan, intra: Sequence[Pair], inter: Sequence[Any], forward: str,
                           step: str, drop: Sequence[Order], *, max_in_flight: int, tolerance: float = 0.005,
                           **search_args: Any) -> WeightVersionsPlan:
    """The fastest plan with ``versions.deps(forward, step)`` for staleness 1 .. ``max_in_flight - 1`` (the
    smallest within ``tolerance`` of the fastest), keeping the baseline's placement orders but ``drop`` and those
    the versions replace (see the module docstring); ``search_args`` go to ``search_plan``."""
    names = list(baseline.task_names)
    check_pair(names, intra, forward, step, "weight versions")
    plain = [e for e in inter if not (e[0] == forward and e[1] == step and (len(e) == 2 or e[2] == 1))]
    chain = set(chain_between(names, intra, forward, step))
    found: Dict[int, PlanSearch] = {}
    for k in range(1, max(2, max_in_flight)):
        dependency = (forward, step, k + 1)
        deps_intra, deps_inter = _intra_map(names, intra), _inter_map(names, [*plain, dependency])
        placed = keep_placement(baseline, names, deps_intra, deps_inter, (), "", str).kept
        replaced = [o for o in placed if o[2] == 1 and o[0] in chain and o[1] in chain and o not in drop]
        kept = [o for o in placed if o not in replaced and o not in drop]
        waits = orders_to_drop_too(names, deps_intra, deps_inter, kept, (forward, step, 1))
        if waits or HappensBefore(names, deps_intra, deps_inter).before(step, forward, 1):
            return WeightVersionsPlan(forward, step, k, dependency, None, tuple(waits))
        relation = HappensBefore(names, *with_orders(deps_intra, deps_inter, kept))
        dropped = [*drop, *(o for o in replaced if not relation.before(o[1], o[0], o[2]))]
        search = search_plan(baseline.tasks, intra, [*plain, dependency], max_in_flight=max_in_flight,
                             baseline=baseline, tolerance=tolerance,
                             drop_orders=[(t, d, "inter" if back else "intra") for t, d, back in dropped],
                             **search_args)
        found[k] = search
    seconds = {k: search.result.seconds for k, search in found.items()}
    fastest = min(seconds.values())
    k = min(k for k, value in seconds.items() if value <= fastest * (1 + tolerance))
    return WeightVersionsPlan(forward, step, k, (forward, step, k + 1), found[k])


def _intra_map(names: Sequence[str], intra: Sequence[Pair]) -> Dict[str, List[str]]:
    found: Dict[str, List[str]] = {n: [] for n in names}
    for task, dep in intra:
        found[task].append(dep)
    return found


def _inter_map(names: Sequence[str], inter: Sequence[Any]) -> Dict[str, List[Tuple[str, int]]]:
    found: Dict[str, List[Tuple[str, int]]] = {n: [] for n in names}
    for entry in inter:
        found[entry[0]].append((entry[1], entry[2] if len(entry) == 3 else 1))
    return found
