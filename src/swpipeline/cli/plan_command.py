"""``swpipeline plan TRACE.json``: where a traced run's time went, and a better plan for it.

Reads a trace written by ``pipe.run(data, trace="run.json")``, measures each task's
cost from it, simulates the plan that ran (to show how well the model matches the
run), prints the critical path and the bubbles per lane, and asks ``autoplan`` for
the fastest plan of the same tasks within the same number of iterations alive (or
``--max-in-flight``), with its predicted speedup::

    swpipeline plan out/demo_trace.json
    swpipeline plan run.json --plan mymodule:make_plan --max-in-flight 2 --thread-groups default,prep
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..analysis.races import HappensBefore, Placement
from .args import int_at_least, name_list
from ..planning.autoplan import search_plan
from ..planning.costs import TaskCosts
from ..planning.kept_orders import Order, declaration_text, grouped_text, order_text, orders_dropped, placement_orders
from ..planning.overheads import EngineOverheads
from ..plan.model import PipelinePlan
from ..planning.plan_report import format_comparison, format_plan
from ..planning.simulator import simulate
from ..observe.timeline import Timeline
from ..planning.trace_read import declared_plan, plan_from_timeline, read_trace

__all__: List[str] = []

COMMAND_HELP = """\
Reads a trace written by pipe.run(data, trace="run.json"), measures each task's cost
from it, simulates the plan that ran (to show how well the model matches the run),
prints the critical path and the bubbles per lane, and searches for the fastest plan
of the same tasks within the same number of iterations alive (or --max-in-flight),
with its predicted speedup. For example:

  swpipeline plan out/demo_trace.json
  swpipeline plan run.json --plan mymodule:make_plan --max-in-flight 2 --thread-groups default,prep
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
    parser.add_argument("--keep-orders", action="store_true",
                        help="keep, in the suggestion, every order the traced run got only from where its tasks "
                             "ran (two tasks on one thread run in a fixed order): declared as dependencies. "
                             "Without it the suggestion may drop them, and says which it drops")
    parser.add_argument("--keep-order", type=_order, action="append", default=[], metavar="TASK,DEP,intra|inter",
                        help="keep TASK after DEP of the same iteration (intra) or of the one before (inter) in the "
                             "suggestion, declared as a dependency (repeat for each order that matters)")


def _order(text: str) -> Order:
    """An argparse type: ``TASK,DEP,intra`` or ``TASK,DEP,inter``."""
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 3 or not all(parts) or parts[2] not in ("intra", "inter"):
        raise argparse.ArgumentTypeError(f"must be TASK,DEP,intra or TASK,DEP,inter (e.g. Forward,OptimizerStep,inter: "
                                         f"Forward(i+1) after OptimizerStep(i)); got {text!r}")
    return parts[0], parts[1], 0 if parts[2] == "intra" else 1


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
        from ..planning.calibrate import calibrate

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
    for task, dep, distance in args.keep_order:
        option = f"--keep-order {task},{dep},{'inter' if distance else 'intra'}"
        unknown = [name for name in (task, dep) if name not in timeline.tasks]
        if unknown:
            raise ValueError(f"{option}: no task {unknown[0]!r} in the trace (its tasks: {', '.join(timeline.tasks)})")
        if distance == 0 and (task == dep or HappensBefore.of_plan(plan).before(task, dep)):
            raise ValueError(f"{option}: {task} runs before {dep} in an iteration (the plan's dependencies say so); "
                             f"an order within one iteration can only follow them (or use inter for {task}(i+1))")
    engine = args.engine or ("dataflow" if "DataFlow" in timeline.engine else "clocked")
    skip_first = args.skip_first if args.skip_first is not None else min(1, traced_iterations - 1)
    return _Inputs(timeline, plan, how, engine, skip_first, args.iterations or traced_iterations)


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
    placed = placement_orders(plan)
    keep = [*(placed if args.keep_orders else []), *args.keep_order]
    search = search_plan(list(plan.tasks), _pairs(plan, "intra"), _pairs(plan, "inter"), costs,
                         max_in_flight=max_in_flight, thread_groups=args.thread_groups,
                         streams=_streams(args.streams), engine=engine, baseline=plan,
                         num_iterations=min(iterations, 200), overheads=overheads, cores=args.cores,
                         keep_orders=keep or None)
    suggested = simulate(search.plan, costs, iterations, engine, None if engine == "clocked" else max_in_flight,
                         overheads=overheads, cores=args.cores)
    how_found = "exhaustive" if search.exhaustive else "local search"
    kept = [f"the {len(placed)} order(s) the traced placement gave"] if args.keep_orders and placed else []
    kept += [order_text(order) for order in args.keep_order]
    keeping = f", keeping {', '.join(kept)}" if kept else ""
    print(f"suggestion ({how_found}, {search.simulated} plans simulated, at most {max_in_flight} iterations "
          f"alive{keeping}):")
    if search.kept_baseline:
        print("no plan is predicted faster than the traced one by more than 0.5%: keep it")
    print(format_plan(search.plan) + "\n")
    print(format_comparison(["traced plan", "suggested"], [plan, search.plan], [traced, suggested], speedup_over=0))
    report = format_dropped(plan, search.plan)
    if report:
        print("\n" + report)
    return 0


def format_dropped(traced: PipelinePlan, suggested: PipelinePlan) -> str:
    """Which orders the traced plan got from its placement alone the suggestion drops, and how to keep them
    ('' where the traced placement gave none)."""
    placed = placement_orders(traced, minimal=False)
    if not placed:
        return ""
    dropped = orders_dropped(suggested, placed)
    if not dropped:
        return f"the suggestion keeps every order the traced run got from its placement alone ({len(placed)})"
    where = Placement(traced)
    lines = [f"the traced run got these orders from its placement alone (tasks on one thread or stream run in a "
             f"fixed order), and the suggestion drops them ({len(dropped)}):"]
    by_place: Dict[Optional[str], List[Order]] = {}
    for order in dropped:
        by_place.setdefault(where.shared(order[0], order[1]), []).append(order)
    for shared, orders in by_place.items():
        lines += [f"  - {text}; they ran on {shared}" for text in grouped_text(orders)]
    task, dep, distance = dropped[0]
    lines.append(f"where one of two such tasks writes what the other reads or writes (weights, gradients, a "
                 f"buffer), the suggestion races. To keep them all, run again with --keep-orders; to keep those "
                 f"that matter, with --keep-order for each (e.g. --keep-order {task},{dep},"
                 f"{'inter' if distance else 'intra'}), or declare them in the plan "
                 f"({declaration_text(dropped[0])}; analyze(plan, batch) names them)")
    return "\n".join(lines)


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
