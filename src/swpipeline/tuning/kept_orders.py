"""Orders a plan relies on without declaring them, and whether another plan keeps them.

Two tasks on one thread group or stream run in the schedule's order on both engines,
so a plan can work only because of where its tasks sit: ``Forward(i+1)`` reads the
weights after ``OptimizerStep(i)`` updated them because both run on the training
thread. A plan search moves tasks; it must keep such an order, or say that it drops it::

    traced plan     thread default:  F(i) B(i) O(i) F(i+1) ...   F(i+1) after O(i): by placement only
    a suggestion    thread default:  F(i) B(i) F(i+1) ...        O(i) on another thread: no longer ordered
                    thread g1:       O(i) ...                    (a race, unless declared)

An *order* is ``(task, depends_on, distance)``: ``task(i)`` after ``depends_on(i - distance)``,
distance 0 or 1 (longer distances follow from a chain of consecutive ones).

* ``placement_orders(plan)``: what the placement orders and the declared dependencies do not;
  any of them may matter when nothing else is known (a trace).
* ``analysis_orders(analysis)``: the ones ``analyze()`` found the tasks really need (its warnings,
  "ordered only by the placement", and its missing dependencies).
* ``orders_dropped(plan, orders)``: those a plan keeps neither by its dependencies nor by its
  placement (nor by a chain of both).
* ``as_dependencies(orders)``: the orders as (intra, inter) dependency pairs, which keep them on
  any placement: how ``search_plan`` keeps them.
* ``keep_placement(baseline, names, intra, inter, drop)``: what a search keeps of a baseline's
  placement: every order it gives that the search's dependencies do not, less the ones the user
  names in ``drop`` (refused where they are not such orders, or where the orders kept still give one).

A minimal list (enough to keep them all) leaves out the orders that the dependencies and the other
listed orders imply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Sequence, Tuple, Union

from ..analysis.races import HappensBefore, InterDeps, Placement
from ..plan.model import Back, PipelinePlan

__all__: List[str] = []

Order = Tuple[str, str, int]  # (task, depends_on, distance): task(i) after depends_on(i - distance)
Pair = Tuple[str, str]


def placement_orders(plan: PipelinePlan, minimal: bool = True) -> List[Order]:
    """The orders ``plan``'s placement gives that its declared dependencies do not imply.

    ``minimal``: leave out those the dependencies and the other listed orders imply (enough to keep
    them all); else every one, as a user must judge them: the minimal set may name
    ``Load(i+1) after Step(i)`` where ``Forward(i+1) after Step(i)`` is the order that matters.
    """
    relation = HappensBefore.of_plan(plan)
    found = [order for order in _placed(plan) if not relation.before(order[1], order[0], order[2])]
    return _minimal(plan.task_names, plan.intra, plan.inter, found) if minimal else found


def analysis_orders(analysis: Any) -> List[Order]:
    """The orders a ``PlanAnalysis`` says the tasks need and the plan does not declare."""
    entries = list(getattr(analysis, "warnings", ())) + list(getattr(analysis, "missing_deps", ()))
    return coerce_orders(entries, "keep_orders")


def coerce_orders(entries: Sequence[Any], where: str) -> List[Order]:
    """``(task, depends_on, kind)`` entries (kind ``"intra"``/``"inter"`` or the distance 0/1; a fourth item,
    an analysis' reason, is ignored) as orders; TypeError/ValueError naming ``where`` otherwise."""
    out: List[Order] = []
    for entry in entries:
        if not isinstance(entry, (tuple, list)) or len(entry) not in (3, 4) or \
                not all(isinstance(n, str) for n in entry[:2]):
            raise TypeError(f"{where}: expected (task, depends_on, 'intra' or 'inter') entries or a PlanAnalysis, "
                            f"got {entry!r}")
        kind = entry[2]
        distance = {"intra": 0, "inter": 1}.get(kind) if isinstance(kind, str) else \
            kind if isinstance(kind, int) and not isinstance(kind, bool) and kind in (0, 1) else None
        if distance is None:
            raise ValueError(f"{where}: the kind of ({entry[0]!r}, {entry[1]!r}) must be 'intra' or 'inter' (or the "
                             f"distance 0 or 1), got {kind!r}")
        order = (entry[0], entry[1], distance)
        if order not in out:
            out.append(order)
    return out


def orders_dropped(plan: PipelinePlan, orders: Sequence[Order]) -> List[Order]:
    """The ``orders`` that ``plan`` keeps neither by its dependencies nor by its placement (nor by a chain of
    both), in the given order."""
    intra, inter = with_orders(plan.intra, plan.inter, _placed(plan))
    relation = HappensBefore(plan.task_names, intra, inter)
    return [o for o in orders if o[0] in intra and o[1] in intra and not relation.before(o[1], o[0], o[2])]


def as_dependencies(orders: Sequence[Order]) -> Tuple[List[Pair], List[Pair]]:
    """The orders as ``(intra_iter_deps, inter_iter_deps)`` pairs."""
    return ([(t, d) for t, d, distance in orders if distance == 0],
            [(t, d) for t, d, distance in orders if distance == 1])


@dataclass(frozen=True)
class KeptPlacement:
    """What a search keeps of its baseline's placement.

    Attributes:
        kept: every order the placement gives that the dependencies do not, less those dropped.
        declared: a minimal list of them (the rest follow), to declare as dependencies.
        dropped: the orders dropped, as the user named them.
    """

    kept: Tuple[Order, ...]
    declared: Tuple[Order, ...]
    dropped: Tuple[Order, ...]


def keep_placement(baseline: PipelinePlan, names: Sequence[str], intra: Mapping[str, Sequence[str]],
                   inter: InterDeps, drop: Sequence[Order], where: str, spell: Callable[[Order], str],
                   whose: str = "the baseline's") -> KeptPlacement:
    """Every order ``baseline``'s placement gives that the dependencies ``intra``/``inter`` do not, less ``drop``.

    ``spell`` writes an order as the user gives one; ``where`` starts the messages, ``whose`` names the
    placement in them.

    Raises:
        ValueError: an order in ``drop`` that the placement does not give (the dependencies give it, or
            nothing orders the two), or one that the orders kept still give (naming them).
    """
    relation = HappensBefore(names, intra, inter)
    placed = [o for o in _placed(baseline) if not relation.before(o[1], o[0], o[2])]
    for order in drop:
        if order not in placed:
            task, dep, distance = order
            given = "the dependencies give it" if relation.before(dep, task, distance) else \
                f"the dependencies run {task} first" if distance == 0 and relation.before(task, dep) else \
                "its placement did not run them in that order"
            listed = "; ".join(spell(o) for o in placed) or "none"
            raise ValueError(f"{where} {spell(order)}: {order_text(order)} is not an order {whose} placement "
                             f"alone gave ({given}); those it gave: {listed}")
    kept = [o for o in placed if o not in drop]
    for order in drop:
        chain = orders_to_drop_too(names, intra, inter, kept, order)
        if chain:
            raise ValueError(f"{where} {spell(order)}: {order_text(order)} still follows from other orders kept "
                             f"({', '.join(order_text(o) for o in chain)}); drop those too where nothing needs them: "
                             f"{'; '.join(spell(o) for o in chain)}")
    return KeptPlacement(tuple(kept), tuple(_minimal(names, intra, inter, kept)), tuple(drop))


def orders_on_chain(names: Sequence[str], intra: Mapping[str, Sequence[str]], inter: InterDeps,
                    orders: Sequence[Order], target: Order) -> List[Order]:
    """The ``orders`` on some chain (with the dependencies) that runs ``target``'s task after its dependency
    ([] where none does)."""
    relation = HappensBefore(names, *with_orders(intra, inter, orders))
    task, dep, distance = target
    if not relation.before(dep, task, distance):
        return []

    def reaches(first: str, second: str, back: int) -> bool:  # first(i - back) is second(i) or before it
        return (back == 0 and first == second) or relation.before(first, second, back)

    return [o for o in orders if any(reaches(dep, o[1], a) and reaches(o[0], task, distance - o[2] - a)
                                     for a in range(distance - o[2] + 1))]


def orders_to_drop_too(names: Sequence[str], intra: Mapping[str, Sequence[str]], inter: InterDeps,
                       orders: Sequence[Order], target: Order) -> List[Order]:
    """Few of ``orders`` (none needless) without which the dependencies and the other orders no longer run
    ``target``'s task after its dependency, orders across iterations first ([] where nothing runs it so)."""
    chain = orders_on_chain(names, intra, inter, orders, target)
    task, dep, distance = target

    def gives(without: Sequence[Order]) -> bool:
        relation = HappensBefore(names, *with_orders(intra, inter, [o for o in orders if o not in without]))
        return relation.before(dep, task, distance)

    cut: List[Order] = []
    for order in sorted(chain, key=lambda o: -o[2]):  # stable: across iterations first, then in the given order
        if not gives(cut):
            break
        cut.append(order)
    for order in reversed(list(cut)):
        if not gives([o for o in cut if o != order]):
            cut.remove(order)
    return cut


def order_text(order: Order) -> str:
    """``Forward(i+1) after OptimizerStep(i)``."""
    task, dep, distance = order
    return f"{task}(i{'+1' if distance else ''}) after {dep}(i)"


def grouped_text(orders: Sequence[Order]) -> List[str]:
    """The orders grouped by what comes first: ``after OptimizerStep(i): Load(i+1), Forward(i+1)``."""
    groups: Dict[Tuple[str, int], List[str]] = {}
    for task, dep, distance in orders:
        groups.setdefault((dep, distance), []).append(f"{task}(i{'+1' if distance else ''})")
    return [f"after {dep}(i): {', '.join(tasks)}" for (dep, _), tasks in groups.items()]


def _placed(plan: PipelinePlan) -> List[Order]:
    """Every order of two different tasks that the placement gives, distance 0 and 1."""
    placement = Placement(plan)
    names = plan.task_names
    return [(task, dep, distance) for distance in (0, 1) for task in names for dep in names
            if task != dep and placement.before(dep, task, distance)]


def with_orders(intra: Mapping[str, Sequence[str]], inter: InterDeps,
                orders: Sequence[Order]) -> Tuple[Dict[str, List[str]], Dict[str, List[Union[str, Back]]]]:
    """The dependencies with ``orders`` added (as intra- and inter-iteration dependencies)."""
    merged_intra = {task: list(deps) for task, deps in intra.items()}
    merged_inter: Dict[str, List[Union[str, Back]]] = {task: list(deps) for task, deps in inter.items()}
    for task, dep, distance in orders:
        if distance:
            merged_inter.setdefault(task, []).append((dep, distance))
        elif dep not in merged_intra.setdefault(task, []):
            merged_intra[task].append(dep)
    return merged_intra, merged_inter


def _minimal(names: Sequence[str], intra: Mapping[str, Sequence[str]], inter: InterDeps,
             orders: Sequence[Order]) -> List[Order]:
    """The orders that the dependencies and the other kept orders do not imply (each checked once, in order)."""
    kept = list(orders)
    for order in orders:
        others = [o for o in kept if o != order]
        relation = HappensBefore(names, *with_orders(intra, inter, others))
        if relation.before(order[1], order[0], order[2]):
            kept = others
    return kept
