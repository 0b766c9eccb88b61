"""``autoplan``: the plan with the best simulated throughput for a task set, within a memory budget.

Given the tasks, their dependencies and what they cost, it chooses every task's stage,
thread group and stream (from those allowed) so that the simulated run is fastest with
at most ``max_in_flight`` iterations alive (batches and contexts held at once)::

    costs (measured)  --->  candidates (valid stages x thread groups x streams)
                                 |  simulate each (cheap), lower bounds skip the hopeless
                                 v
                            the fastest; within ``tolerance`` of it, the simplest

It is exhaustive while the space is small (``exhaustive_limit`` candidates; every
problem of up to 6 tasks on the CPU with ``max_in_flight <= 3``) and a deterministic
local search beyond (``plan_search``). The plan it returns is valid for both engines
(it follows the stage rules); for ``engine="dataflow"`` run it with
``DataFlowPipeline(plan, max_depth=max_in_flight)``.

Given a ``baseline``, it keeps every order the baseline's placement gives (``kept_orders``),
declared as dependencies where the tasks move apart, but those ``drop_orders`` names: a
plan that works may work only because two tasks share a thread, and nothing can tell which
of those orders its tasks need (a task may write a Python number no analysis sees).
"""

from __future__ import annotations

from typing import Any, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from .costs import TaskCosts
from .overheads import EngineOverheads
from ..plan.model import InterDependency, PipelinePlan, PipelineTask
from ..analysis.report import PlanAnalysis
from .kept_orders import Order, analysis_orders, as_dependencies, coerce_orders, keep_placement, orders_dropped
from .plan_args import SearchArgs, check_search_args
from .plan_search import Scorer, Space, count_candidates, exhaustive, local, starting_points, valid_stages
from .plan_space import Bounds, Candidate, normalized
from .search_result import PlanSearch
from .sim_result import SimResult
from .sim_model import run_caller_group
from .simulator import simulate

__all__: List[str] = []

TaskRef = Union[PipelineTask, str]
OrderEntry = Tuple[str, str, Union[str, int]]
KeepOrders = Union[PlanAnalysis, Sequence[OrderEntry], None]
EXHAUSTIVE_LIMIT = 200_000
LOCAL_BUDGET = 3000


def autoplan(tasks: Sequence[TaskRef], intra_iter_deps: Sequence[Tuple[TaskRef, TaskRef]],
             inter_iter_deps: Sequence[InterDependency], costs: Union[TaskCosts, Mapping[str, Any]], *,
             max_in_flight: int, thread_groups: Optional[Sequence[str]] = None,
             streams: Optional[Sequence[Optional[str]]] = None, engine: str = "clocked",
             baseline: Optional[PipelinePlan] = None, report: bool = False, **options: Any) -> PipelinePlan:
    """The plan with the best simulated throughput for these tasks, at most ``max_in_flight`` iterations alive.

    Args:
        tasks: the tasks (PipelineTask objects, which the plan will run, or names).
        intra_iter_deps: ``(task, depends_on)`` pairs within one iteration.
        inter_iter_deps: ``(task, depends_on)`` pairs: ``task`` at iteration i needs ``depends_on`` at i - 1;
            ``(task, depends_on, d)`` triples: at i - d.
            Declare every dependency the tasks have: the planner may put any two tasks that
            are not ordered by one on different threads, stages and streams.
        costs: a ``TaskCosts`` or a dict of task name -> seconds.
        max_in_flight: the most iterations alive at once (the depth for the clocked engine,
            ``max_depth`` for the data-flow one).
        thread_groups: the thread group names it may use (default: as many as there are tasks,
            ``"default"`` first, then ``"g1"``, ``"g2"``, ...). The busiest group gets the first name.
        streams: the stream names it may use (``None`` is the default stream). Default: on the CPU,
            one stream per thread group (the default stream for ``"default"``); with device times,
            streams are searched, ``None`` first, then ``"s1"``, ``"s2"``, ...
        engine: ``"clocked"`` or ``"dataflow"``.
        baseline: a plan to compare with (and to start the local search from). Every order its
            placement gives that the dependencies do not (two tasks on one thread group or stream
            run in a fixed order) is kept in the suggestion, declared as a dependency where the
            tasks move apart, unless named in ``drop_orders``.
        report: print ``PlanSearch.format_report()``.
        **options: ``num_iterations`` (simulated per candidate, default 60), ``tolerance`` (prefer a
            simpler plan within this share of the best time, default 0.005), ``overheads``,
            ``data_seconds``, ``jitter``, ``globally_ordered`` (task names), ``pinned`` (task -> the
            thread group it must stay on), ``drop_orders`` (orders of the baseline's placement that the
            suggestion need not keep), ``keep_orders`` (more orders to keep), ``caller_thread_group``,
            ``cores``, ``exhaustive_limit``, ``budget`` (simulations of the local search): see
            ``search_plan``.

    Returns:
        PipelinePlan: the suggested plan.

    Raises:
        TypeError, ValueError: an invalid argument (named in the message).
    """
    found = search_plan(tasks, intra_iter_deps, inter_iter_deps, costs, max_in_flight=max_in_flight,
                        thread_groups=thread_groups, streams=streams, engine=engine, baseline=baseline, **options)
    if report:
        found.print_report()
    return found.plan


def search_plan(tasks: Sequence[TaskRef], intra_iter_deps: Sequence[Tuple[TaskRef, TaskRef]],
                inter_iter_deps: Sequence[InterDependency], costs: Union[TaskCosts, Mapping[str, Any]], *,
                max_in_flight: int, thread_groups: Optional[Sequence[str]] = None,
                streams: Optional[Sequence[Optional[str]]] = None, engine: str = "clocked",
                baseline: Optional[PipelinePlan] = None, num_iterations: int = 60, tolerance: float = 0.005,
                overheads: Optional[EngineOverheads] = None, data_seconds: float = 0.0, jitter: bool = True,
                globally_ordered: Iterable[str] = (), exhaustive_limit: int = EXHAUSTIVE_LIMIT,
                budget: int = LOCAL_BUDGET, pinned: Optional[Mapping[str, str]] = None,
                caller_thread_group: Optional[str] = "auto", cores: Optional[int] = None,
                keep_orders: KeepOrders = None, drop_orders: Sequence[OrderEntry] = ()) -> PlanSearch:
    """``autoplan``, returning the whole ``PlanSearch`` (arguments as for ``autoplan``).

    Args:
        num_iterations: iterations simulated per candidate.
        tolerance: among plans within this share of the fastest, the baseline is kept if it is
            one of them, else the simplest is chosen (fewest iterations alive, thread groups,
            streams, stages within a thread group); 0 for the fastest.
        overheads, data_seconds, jitter: as for ``simulate``.
        globally_ordered: names of tasks to keep globally ordered (also taken from ``baseline``).
        exhaustive_limit: search exhaustively while the space holds at most this many candidates.
        budget: the most candidates the local search simulates.
        pinned: task name -> the thread group it must stay on (e.g. tasks that must run on the
            thread that owns the model); the others are free.
        caller_thread_group: simulate that group on the calling thread, as the engines'
            ``caller_thread_group`` runs it; ``"auto"`` (the default): each candidate's last-stage group,
            as ``run()`` does; None: every group on a worker.
        cores: at most this many task functions run at once (as for ``simulate``): give it when the
            process has fewer cores than the plan could keep busy, or its tasks hold the GIL.
        drop_orders: ``(task, depends_on, "intra" | "inter")`` entries, each an order the baseline's
            placement gives that the suggestion need not keep: ``("Load", "Step", "inter")`` lets
            ``Load(i+1)`` run before ``Step(i)`` ends. Every other order of the placement is kept (a
            trace, or a plan that works, cannot tell which of them its tasks need: a task may write
            a Python number that no analysis sees). Refused where the entry is not such an order, or
            where the orders kept still give it (the message names them). Needs a ``baseline``.
        keep_orders: more orders to keep in every candidate: an ``analyze(baseline, batch)`` result
            (its warnings and its missing dependencies), or ``(task, depends_on, "intra" | "inter")``
            entries. They are added to the dependencies, so the suggested plan declares them and
            keeps them on any thread or stream.

    Raises:
        TypeError, ValueError: an invalid argument (named in the message).
    """
    orders = _orders_to_keep(tasks, keep_orders)
    drops = _orders_to_drop(drop_orders, baseline)

    def checked(extra: Sequence[Order]) -> SearchArgs:
        return _checked(extra, tasks, intra_iter_deps, inter_iter_deps, costs, max_in_flight, thread_groups, streams,
                        engine, baseline, num_iterations, tolerance, overheads, globally_ordered, exhaustive_limit,
                        budget, pinned or {}, caller_thread_group, cores)

    args, placement = checked(orders), None
    if baseline is not None:  # the orders of its placement, less those dropped, declared too
        graph = args.space.graph
        placement = keep_placement(baseline, graph.names, graph.intra_names(), graph.inter_names(), drops,
                                   "autoplan: drop_orders", _entry_text)
        if placement.declared:
            args = checked([*orders, *(o for o in placement.declared if o not in orders)])
    how = _How(engine, num_iterations, jitter, float(data_seconds), tolerance, max_in_flight, cores, exhaustive_limit,
               budget)
    scorer, best, start, candidates, is_exhaustive = _search(args, baseline, how)
    kept = best == start
    keeps_all = baseline is not None and not orders_dropped(baseline, orders)
    plan = baseline if kept and baseline is not None and keeps_all else scorer.plan(best)
    kept_orders = placement.kept if placement else ()

    def simulated(chosen: PipelinePlan, live: Optional[int]) -> SimResult:
        return simulate(chosen, args.costs, num_iterations, engine, live, jitter=jitter, overheads=args.overheads,
                        data_seconds=data_seconds, caller_thread_group=_caller(chosen, caller_thread_group, engine,
                                                                                live), cores=cores)

    result = simulated(plan, None if engine == "clocked" else max_in_flight)
    baseline_result = None
    if baseline is not None:
        baseline_result = simulated(baseline, None if engine == "clocked" else max(max_in_flight, baseline.depth))
    return PlanSearch(plan, result, engine, max_in_flight, is_exhaustive, candidates, len(scorer.cache), baseline,
                      baseline_result, kept, kept_orders, drops)


class _How(NamedTuple):
    """How ``search_plan`` searches (its arguments, checked)."""

    engine: str
    num_iterations: int
    jitter: bool
    data_seconds: float
    tolerance: float
    max_in_flight: int
    cores: Optional[int]
    exhaustive_limit: int
    budget: int


def _search(args: SearchArgs, baseline: Optional[PipelinePlan],
            how: _How) -> Tuple[Scorer, Candidate, Optional[Candidate], int, bool]:
    """The search itself: exhaustive while the space is small, else local from the starting points; returns the
    scorer, the candidate picked, the baseline's (None: none, or it does not fit), the space's size, and whether
    the search was exhaustive."""
    space = args.space
    thread_costs = [args.costs[name].thread_times(how.num_iterations, how.jitter) for name in space.graph.names]
    device_costs = [args.costs[name].device_times(how.num_iterations, how.jitter) for name in space.graph.names]
    scorer = Scorer(space, thread_costs, device_costs, how.engine, args.overheads, how.data_seconds)
    scorer.tolerance = how.tolerance
    candidates = count_candidates(space)
    is_exhaustive = candidates <= how.exhaustive_limit
    start = _encode(space, baseline) if baseline is not None else None
    if is_exhaustive:
        bounds = Bounds(space.graph, thread_costs, device_costs, args.overheads.unit,
                        None if how.engine == "clocked" else how.max_in_flight, how.cores)
        exhaustive(scorer, bounds, how.tolerance)
    else:
        local(scorer, starting_points(space, scorer, start), how.budget)
    return scorer, scorer.pick(how.tolerance, start), start, candidates, is_exhaustive


def _checked(extra: Sequence[Order], tasks: Sequence[TaskRef], intra: Sequence[Any], inter: Sequence[Any],
             *rest: Any) -> SearchArgs:
    """``check_search_args`` with the ``extra`` orders declared (``rest``: its arguments after the dependencies)."""
    kept_intra, kept_inter = as_dependencies(extra)
    try:
        return check_search_args(tasks, [*intra, *kept_intra], [*inter, *kept_inter], *rest)
    except ValueError as exc:
        if kept_intra and "cycle" in str(exc):  # the dependencies alone form none: an order to keep closes it
            raise ValueError(f"autoplan: keep_orders cannot be kept: an order within one iteration runs against the "
                             f"dependencies ({exc})") from None
        raise


def _caller(plan: PipelinePlan, group: Optional[str], engine: str, live: Optional[int]) -> Optional[str]:
    """The group ``run()`` would run on the calling thread, if the plan has it (a plan with no task on it has
    nothing to run on the caller)."""
    found = run_caller_group(plan, engine, plan.depth if live is None else live, group)
    return found if any(s.thread_group == found for s in plan.schedules.values()) else None


def _orders_to_keep(tasks: Sequence[TaskRef], keep_orders: KeepOrders) -> List[Order]:
    """``keep_orders`` as orders of known tasks (TypeError/ValueError in ``autoplan``'s words)."""
    if keep_orders is None:
        return []
    if isinstance(keep_orders, PlanAnalysis):
        orders = analysis_orders(keep_orders)
    elif not isinstance(keep_orders, (list, tuple)):
        raise TypeError(f"autoplan: keep_orders must be a PlanAnalysis (from analyze()) or a list of (task, "
                        f"depends_on, 'intra' or 'inter') entries, got {type(keep_orders).__name__}")
    else:
        orders = coerce_orders(keep_orders, "autoplan: keep_orders")
    if isinstance(tasks, (list, tuple)):  # else check_search_args refuses the tasks themselves
        known = {t if isinstance(t, str) else t.name for t in tasks if isinstance(t, (str, PipelineTask))}
        unknown = sorted({name for order in orders for name in order[:2]} - known)
        if unknown:
            raise ValueError(f"autoplan: keep_orders names unknown task(s) {unknown} (tasks: {sorted(known)}); "
                             f"pass the analysis of a plan of these tasks")
    return orders


def _orders_to_drop(drop_orders: object, baseline: Optional[PipelinePlan]) -> Tuple[Order, ...]:
    """``drop_orders`` as orders (TypeError/ValueError in ``autoplan``'s words; the rest in ``keep_placement``)."""
    if isinstance(drop_orders, (str, bytes)) or not isinstance(drop_orders, (list, tuple)):
        raise TypeError(f"autoplan: drop_orders must be a list of (task, depends_on, 'intra' or 'inter') entries, "
                        f"got {type(drop_orders).__name__}")
    drops = coerce_orders(drop_orders, "autoplan: drop_orders")
    if drops and baseline is None:
        raise ValueError(f"autoplan: drop_orders {[_entry_text(o) for o in drops]} needs a baseline: it names "
                         f"orders of the baseline's placement that the suggestion need not keep; pass baseline=")
    return tuple(drops)


def _entry_text(order: Order) -> str:
    """An order as ``drop_orders`` takes it: ``('Forward', 'Step', 'inter')``."""
    return repr((order[0], order[1], "inter" if order[2] else "intra"))


def _encode(space: Space, plan: PipelinePlan) -> Optional[Candidate]:
    """A plan of the same tasks as a candidate (None if it does not fit the space, or breaks a stage rule of its
    dependencies, e.g. of an order it must keep)."""
    names = space.graph.names
    stages = tuple(plan.stage(n) for n in names)
    groups = normalized([plan.schedules[n].thread_group for n in names])
    streams = normalized([str(plan.schedules[n].stream) for n in names])
    if not valid_stages(space, stages) or max(groups) >= len(space.group_names):
        return None
    return (stages, groups, streams if space.search_streams else groups)
