"""``swpipeline plan TRACE.json``: where a traced run's time went, and a better plan for it.

Reads a trace written by ``pipe.run(data, trace="run.json")``, measures each task's
cost from it, simulates the plan that ran (to show how well the model matches the
run), prints the critical path and the bubbles per lane, and asks ``autoplan`` for
the fastest plan of the same tasks within the same number of iterations alive (or
``--max-in-flight``), with its predicted speedup. The suggestion keeps every order the
traced placement gave but those ``--drop-order`` names (``plan_orders.py`` says what a
plan that drops more would gain, and the staleness trade-off)::

    swpipeline plan out/demo_trace.json
    swpipeline plan run.json --plan mymodule:make_plan --max-in-flight 2 --thread-groups default,prep
    swpipeline plan run.json --drop-order Load,Step,inter --weight-versions Forward,Step
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..analysis.races import HappensBefore
from .args import int_at_least, name_list
from .plan_orders import flag, format_faster, format_kept, format_tradeoff
from ..tuning.autoplan import search_plan
from ..tuning.costs import TaskCosts
from ..tuning.kept_orders import Order, keep_placement, order_text, with_orders
from ..tuning.overheads import EngineOverheads
from ..plan.model import PipelinePlan
from ..tuning.plan_report import format_comparison, format_plan
from ..tuning.sim_result import SimResult
from ..tuning.simulator import simulate
from ..tuning.staleness import check_pair, weight_versions_search
from ..observe.timeline import Timeline
from ..tuning.trace_read import declared_plan, plan_from_timeline, read_trace

__all__: List[str] = []

COMMAND_HELP = """\
Reads a trace written by pipe.run(data, trace="run.json"), measures each task's cost
from it, simulates the plan that ran (to show how well the model matches the run),
prints the critical path and the bubbles per lane, and searches for the fastest plan
of the same tasks within the same number of iterations alive (or --max-in-flight),
with its predicted speedup. The suggestion keeps every order the traced run got from
where its tasks ran (two tasks on one thread run in a fixed order) but those you drop
with --drop-order; the report names those a faster plan drops. For example:

  swpipeline plan out/demo_trace.json
  swpipeline plan run.json --plan mymodule:make_plan --max-in-flight 2 --thread-groups default,prep
  swpipeline plan run.json --drop-order Load,Step,inter --weight-versions Forward,Step
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``swpipeline plan`` options to ``parser``."""
    parser.add_argument("trace", metavar="TRACE.json", help="a trace written by pipe.run(data, trace='run.json')")
    parser.add_argument("--plan", metavar="MODULE:NAME", default=None,
                        help="the PipelinePlan that ran (or a function returning it), for its exact dependencies; "
                             "for a trace that does not carry them (run(trace=...) writes them); otherwise they "
                             "are rebuilt from the trace, keeping each thread's order")
    parser.add_argument("--max-in-flight", type=int_at_least(1), default=None, metavar="N",
                        help="most iterations alive in the suggestion (default: as in the traced run)")
    parser.add_argument("--engine", choices=["clocked", "dataflow"], default=None,
                        help="engine to plan for (default: the traced run's)")
    parser.add_argument("--thread-groups", type=name_list("thread group"), default=None, metavar="A,B,...",
                        help="thread group names the suggestion may use (default: any number)")
    parser.add_argument("--streams", type=name_list("stream"), default=None, metavar="A,B,...",
                        help="stream names the suggestion may use ('default' is the default stream)")
    parser.add_argument("--skip-first", type=int_at_least(0), default=None, metavar="K",
                        help="leave the first K iterations out of the costs (warm-up; default 1, or 0 for a "
                             "trace of one iteration)")
    parser.add_argument("--iterations", type=int_at_least(1), default=None, metavar="N",
                        help="iterations to simulate (default: as many as the trace has)")
    parser.add_argument("--cores", type=int_at_least(1), default=None, metavar="N",
                        help="at most N task functions run at once (the cores the run really has; default: "
                             "every thread group runs when it can)")
    parser.add_argument("--overheads", choices=["default", "zero", "calibrate"], default="default",
                        help="the engine's own costs: measured defaults, none, or measured now on this machine")
    parser.add_argument("--drop-order", type=_order, action="append", default=[], metavar="TASK,DEP,intra|inter",
                        help="an order the traced run got from its placement alone (two tasks on one thread run in "
                             "a fixed order) that the suggestion need not keep: TASK may run before DEP of the same "
                             "iteration (intra) or of the one before (inter) ends. Every other such order is kept "
                             "(repeat for each; the report names those a faster plan drops)")
    parser.add_argument("--keep-order", type=_order, action="append", default=[], metavar="TASK,DEP,intra|inter",
                        help="keep TASK after DEP of the same iteration (intra) or of the one before (inter) in the "
                             "suggestion, declared as a dependency, where the placement did not order them")
    parser.add_argument("--weight-versions", type=_pair, default=None, metavar="FORWARD,STEP",
                        help="FORWARD computes on a module's weights that STEP (the optimizer step) updates: show, "
                             "beside the exact suggestion, the plan that lets FORWARD overlap the steps before it "
                             "with WeightVersions (weights k steps old, the same in every run), and its speed")
    parser.add_argument("--keep-orders", action="store_true",
                        help="keep every order the traced placement gave: the default now (accepted so that older "
                             "command lines run; it cannot go with --drop-order)")


def _order(text: str) -> Order:
    """An argparse type: ``TASK,DEP,intra`` or ``TASK,DEP,inter``."""
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 3 or not all(parts) or parts[2] not in ("intra", "inter"):
        raise argparse.ArgumentTypeError(f"must be TASK,DEP,intra or TASK,DEP,inter (e.g. Forward,OptimizerStep,inter: "
                                         f"Forward(i+1) after OptimizerStep(i)); got {text!r}")
    return parts[0], parts[1], 0 if parts[2] == "intra" else 1


def _pair(text: str) -> Tuple[str, str]:
    """An argparse type: ``FORWARD,STEP``."""
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 2 or not all(parts):
        raise argparse.ArgumentTypeError(f"must be FORWARD,STEP, the task that computes on the weights and the "
                                         f"optimizer step that updates them (e.g. Forward,OptimizerStep); got {text!r}")
    return parts[0], parts[1]


def _load_plan(spec: str) -> PipelinePlan:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"--plan must be MODULE:NAME (e.g. mytrain:plan), got {spec!r}")
    sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # whatever importing the user's module raised
        raise ValueError(f"--plan {spec}: cannot import {module_name} ({type(exc).__name__}: {exc})") from None
    if not hasattr(module, attr):
        raise ValueError(f"--plan {spec}: module {module_name} has no {attr!r}; name the plan, or a function "
                         f"returning it")
    value = getattr(module, attr)
    if not isinstance(value, PipelinePlan) and callable(value):
        try:
            value = value()
        except Exception as exc:  # whatever the user's function raised
            raise ValueError(f"--plan {spec}: {attr}() raised {type(exc).__name__}: {exc}") from None
    if not isinstance(value, PipelinePlan):
        raise ValueError(f"--plan {spec}: expected a PipelinePlan or a function returning one, got "
                         f"{type(value).__name__}")
    return value


def _overheads(choice: str) -> EngineOverheads:
    if choice == "zero":
        return EngineOverheads.zero()
    if choice == "calibrate":
        from ..tuning.calibrate import calibrate

        return calibrate()
    return EngineOverheads()


def run(args: argparse.Namespace) -> int:
    """Run ``swpipeline plan`` for parsed arguments; returns the exit code (2: a bad argument or trace)."""
    try:
        return _run(args)
    except (ValueError, TypeError) as exc:
        print(f"swpipeline plan: error: {exc}", file=sys.stderr)
        return 2


@dataclass(frozen=True)
class _Inputs:
    """What ``swpipeline plan`` works from, read and checked before anything is printed."""

    timeline: Timeline
    plan: PipelinePlan
    how: str  # where the dependencies came from, in words
    engine: str
    skip_first: int
    iterations: int


def _read_inputs(args: argparse.Namespace) -> _Inputs:
    """The trace, the plan that ran and the options, checked (ValueError in command-line words)."""
    try:
        timeline, other = read_trace(args.trace)
    except OSError as exc:
        raise ValueError(f"{args.trace}: cannot be read ({exc.strerror or exc}); pass a trace written by "
                         f"pipe.run(data, trace='run.json')") from None
    traced_iterations = timeline.num_iterations
    if args.skip_first is not None and args.skip_first >= traced_iterations:
        raise ValueError(f"--skip-first {args.skip_first}: the trace has {traced_iterations} iteration(s), so no "
                         f"cost would be left; leave out at most {traced_iterations - 1}")
    declared = declared_plan(other, timeline.tasks, args.trace)
    if args.plan is not None:
        plan, how = _load_plan(args.plan), f"from {args.plan}"
        plan_names, traced_names = sorted(plan.task_names), sorted(timeline.tasks)
        if plan_names != traced_names:
            raise ValueError(f"--plan {args.plan}: its tasks {plan_names} are not the traced ones {traced_names}")
    else:
        try:
            plan, from_trace = plan_from_timeline(timeline, declared)
        except ValueError as exc:
            raise ValueError(f"{args.trace}: the plan it records does not fit its task spans ({exc}); pass "
                             f"--plan MODULE:NAME with the plan that ran") from None
        how = ("as declared in the trace" if from_trace else "rebuilt from the trace: every observed wait, and each "
               "thread group's tasks in the order they ran (give --plan MODULE:NAME for the plan's own)")
    _check_orders(args, plan, timeline.tasks)
    engine = args.engine or ("dataflow" if "DataFlow" in timeline.engine else "clocked")
    skip_first = args.skip_first if args.skip_first is not None else min(1, traced_iterations - 1)
    return _Inputs(timeline, plan, how, engine, skip_first, args.iterations or traced_iterations)


def _check_orders(args: argparse.Namespace, plan: PipelinePlan, names: Sequence[str]) -> None:
    """``--keep-order``, ``--drop-order`` and ``--weight-versions`` against the plan (ValueError in their words)."""
    if args.keep_orders and args.drop_order:
        raise ValueError(f"--keep-orders keeps every order the traced placement gave (the default now) and "
                         f"--drop-order {flag(args.drop_order[0])} drops one: leave out --keep-orders")
    named = [(f"--keep-order {flag(o)}", o[:2]) for o in args.keep_order]
    named += [(f"--drop-order {flag(o)}", o[:2]) for o in args.drop_order]
    if args.weight_versions is not None:
        named.append((f"--weight-versions {','.join(args.weight_versions)}", args.weight_versions))
    for option, pair in named:
        unknown = [name for name in pair if name not in names]
        if unknown:
            raise ValueError(f"{option}: no task {unknown[0]!r} in the trace (its tasks: {', '.join(names)})")
    for task, dep, distance in args.keep_order:
        if distance == 0 and (task == dep or HappensBefore.of_plan(plan).before(task, dep)):
            raise ValueError(f"--keep-order {flag((task, dep, distance))}: {task} runs before {dep} in an iteration "
                             f"(the plan's dependencies say so); an order within one iteration can only follow them "
                             f"(or use inter for {task}(i+1))")
    intra, inter = with_orders(plan.intra, plan.inter, args.keep_order)
    keep_placement(plan, plan.task_names, intra, inter, args.drop_order, "--drop-order", flag, "the traced")
    if args.weight_versions is not None:
        forward, step = args.weight_versions
        check_pair(list(names), _pairs(plan, "intra"), forward, step, f"--weight-versions {forward},{step}")


def _run(args: argparse.Namespace) -> int:
    inputs = _read_inputs(args)
    timeline, plan, engine, iterations = inputs.timeline, inputs.plan, inputs.engine, inputs.iterations
    costs = TaskCosts.from_timeline(timeline, skip_first=inputs.skip_first)
    overheads = _overheads(args.overheads)
    live = _traced_live(timeline) if engine == "dataflow" else None
    traced = simulate(plan, costs, iterations, engine, None if live is None else max(live, plan.depth),
                      overheads=overheads, cores=args.cores)
    wall = timeline.wall
    print(f"trace {args.trace}: {timeline.engine} on {timeline.device}, {timeline.num_iterations} iterations in "
          f"{wall:.3f} s ({wall / max(1, timeline.num_iterations) * 1e3:.3f} ms/iteration)")
    print(f"dependencies {inputs.how}\n")
    print(costs.format() + "\n")
    print(f"the traced plan, simulated from these costs: {traced.seconds:.3f} s for {iterations} iterations "
          f"({(traced.seconds / wall - 1) if iterations == timeline.num_iterations and wall > 0 else 0:+.1%} "
          f"against the trace)\n")
    print("where the time goes:")
    print(traced.format() + "\n")
    max_in_flight = args.max_in_flight or (live if live is not None else plan.depth)
    search_args: Dict[str, Any] = dict(costs=costs, max_in_flight=max_in_flight, thread_groups=args.thread_groups,
                                       streams=_streams(args.streams), engine=engine,
                                       num_iterations=min(iterations, 200), overheads=overheads, cores=args.cores,
                                       keep_orders=args.keep_order or None)

    def predict(suggested: PipelinePlan) -> SimResult:
        return simulate(suggested, costs, iterations, engine, None if engine == "clocked" else max_in_flight,
                        overheads=overheads, cores=args.cores)

    _suggest(args, plan, traced, search_args, predict)
    return 0


def _suggest(args: argparse.Namespace, plan: PipelinePlan, traced: SimResult, search_args: Dict[str, Any],
             predict: Callable[[PipelinePlan], SimResult]) -> None:
    """Print the suggestion, what it keeps of the orders the traced placement gave, what dropping more would
    gain, and the staleness trade-off where ``--weight-versions`` asks for it."""
    intra, inter = _pairs(plan, "intra"), _pairs(plan, "inter")
    search = search_plan(list(plan.tasks), intra, inter, baseline=plan, drop_orders=_entries(args.drop_order),
                         **search_args)
    suggested = predict(search.plan)
    keeping = f", keeping {', '.join(order_text(o) for o in args.keep_order)}" if args.keep_order else ""
    print(f"suggestion ({'exhaustive' if search.exhaustive else 'local search'}, {search.simulated} plans simulated, "
          f"at most {search.max_in_flight} iterations alive{keeping}):")
    if search.kept_baseline:
        print("no plan is predicted faster than the traced one by more than 0.5%: keep it")
    print(format_plan(search.plan) + "\n")
    print(format_comparison(["traced plan", "suggested"], [plan, search.plan], [traced, suggested], speedup_over=0))
    sections = [format_kept(plan, search)]
    if search.kept_orders:  # the same search with every order of the placement dropped
        free = search_plan(list(plan.tasks), intra, inter, baseline=plan,
                           drop_orders=_entries([*search.dropped_orders, *search.kept_orders]), **search_args)
        sections.append(format_faster(plan, search, traced.seconds / suggested.seconds, free,
                                      traced.seconds / predict(free.plan).seconds, args.weight_versions is not None))
    if args.weight_versions is not None:
        forward, step = args.weight_versions
        choice = weight_versions_search(plan, intra, inter, forward, step, search.dropped_orders, **search_args)
        sections.append(format_tradeoff(plan, traced, search.plan, suggested, choice,
                                        None if choice.search is None else predict(choice.search.plan)))
    for section in sections:
        if section:
            print("\n" + section)


def _entries(orders: Sequence[Order]) -> List[Tuple[str, str, str]]:
    """Orders as ``search_plan``'s entries: ``("Forward", "Step", "inter")``."""
    return [(task, dep, "inter" if distance else "intra") for task, dep, distance in orders]


def _streams(names: Optional[List[str]]) -> Optional[List[Optional[str]]]:
    """``--streams`` names, "default" as None (the default stream)."""
    return None if names is None else [None if name == "default" else name for name in names]


def _pairs(plan: PipelinePlan, which: str) -> List[Any]:
    if which == "intra":
        return [(t, d) for t in plan.task_names for d in plan.intra[t]]
    return plan.inter_entries()


def _traced_live(timeline: Timeline) -> int:
    """The most iterations that had started and not finished at once in the trace (a data-flow run's max_depth)."""
    span: Dict[int, Tuple[float, float]] = {}
    for r in timeline.records:
        lo, hi = span.get(r.iteration, (r.cpu_start, r.cpu_end))
        span[r.iteration] = (min(lo, r.cpu_start), max(hi, r.cpu_end))
    events = sorted([(s, 1) for s, _ in span.values()] + [(e, -1) for _, e in span.values()])
    alive = peak = 0
    for _, delta in events:
        alive += delta
        peak = max(peak, alive)
    return max(1, peak)
