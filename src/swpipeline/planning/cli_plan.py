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
from typing import Any, Dict, List, Optional, Tuple

from .autoplan import search_plan
from .costs import TaskCosts
from .overheads import EngineOverheads
from ..plan import PipelinePlan
from .plan_report import format_comparison, format_plan
from .simulator import simulate
from ..timeline import Timeline
from .trace_read import plan_from_timeline, read_trace

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
    parser.add_argument("--max-in-flight", type=int, default=None, metavar="N",
                        help="most iterations alive in the suggestion (default: as in the traced run)")
    parser.add_argument("--engine", choices=["clocked", "dataflow"], default=None,
                        help="engine to plan for (default: the traced run's)")
    parser.add_argument("--thread-groups", default=None, metavar="A,B,...",
                        help="thread group names the suggestion may use (default: any number)")
    parser.add_argument("--streams", default=None, metavar="A,B,...",
                        help="stream names the suggestion may use ('default' is the default stream)")
    parser.add_argument("--skip-first", type=int, default=1, metavar="K",
                        help="leave the first K iterations out of the costs (warm-up; default 1)")
    parser.add_argument("--iterations", type=int, default=None, metavar="N",
                        help="iterations to simulate (default: as many as the trace has)")
    parser.add_argument("--cores", type=int, default=None, metavar="N",
                        help="at most N task functions run at once (the cores the run really has; default: "
                             "every thread group runs when it can)")
    parser.add_argument("--overheads", choices=["default", "zero", "calibrate"], default="default",
                        help="the engine's own costs: measured defaults, none, or measured now on this machine")


def _names(text: Optional[str], streams: bool) -> Optional[List[Any]]:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    return [None if streams and n == "default" else n for n in names]


def _load_plan(spec: str) -> PipelinePlan:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"--plan must be MODULE:NAME (e.g. mytrain:plan), got {spec!r}")
    sys.path.insert(0, "")
    value = getattr(importlib.import_module(module_name), attr)
    if not isinstance(value, PipelinePlan) and callable(value):
        value = value()
    if not isinstance(value, PipelinePlan):
        raise ValueError(f"--plan {spec}: expected a PipelinePlan or a function returning one, got "
                         f"{type(value).__name__}")
    return value


def _overheads(choice: str) -> EngineOverheads:
    if choice == "zero":
        return EngineOverheads.zero()
    if choice == "calibrate":
        from .calibrate import calibrate

        return calibrate()
    return EngineOverheads()


def run(args: argparse.Namespace) -> int:
    """Run ``swpipeline plan`` for parsed arguments; returns the exit code (2: a bad argument or trace)."""
    try:
        return _run(args)
    except (OSError, ValueError, TypeError, ImportError, AttributeError) as exc:
        print(f"swpipeline plan: error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    timeline, other = read_trace(args.trace)
    declared = other.get("plan") if isinstance(other.get("plan"), dict) else None
    if args.plan is not None:
        plan, how = _load_plan(args.plan), f"from {args.plan}"
        plan_names, traced_names = sorted(plan.task_names), sorted(timeline.tasks)
        if plan_names != traced_names:
            raise ValueError(f"--plan {args.plan}: its tasks {plan_names} are not the traced ones {traced_names}")
    else:
        plan, from_trace = plan_from_timeline(timeline, declared)
        how = ("as declared in the trace" if from_trace else "rebuilt from the trace: every observed wait, and each "
               "thread group's tasks in the order they ran (give --plan MODULE:NAME for the plan's own)")
    engine = args.engine or ("dataflow" if "DataFlow" in timeline.engine else "clocked")
    costs = TaskCosts.from_timeline(timeline, skip_first=min(args.skip_first, max(0, timeline.num_iterations - 1)))
    iterations = args.iterations or timeline.num_iterations
    overheads = _overheads(args.overheads)
    live = _traced_live(timeline) if engine == "dataflow" else None
    traced = simulate(plan, costs, iterations, engine, None if live is None else max(live, plan.depth),
                      overheads=overheads, cores=args.cores)
    wall = timeline.wall
    print(f"trace {args.trace}: {timeline.engine} on {timeline.device}, {timeline.num_iterations} iterations in "
          f"{wall:.3f} s ({wall / max(1, timeline.num_iterations) * 1e3:.3f} ms/iteration)")
    print(f"dependencies {how}\n")
    print(costs.format() + "\n")
    print(f"the traced plan, simulated from these costs: {traced.seconds:.3f} s for {iterations} iterations "
          f"({(traced.seconds / wall - 1) if iterations == timeline.num_iterations and wall > 0 else 0:+.1%} "
          f"against the trace)\n")
    print("where the time goes:")
    print(traced.format() + "\n")
    max_in_flight = args.max_in_flight or (live if live is not None else plan.depth)
    search = search_plan(list(plan.tasks), _pairs(plan, "intra"), _pairs(plan, "inter"), costs,
                         max_in_flight=max_in_flight, thread_groups=_names(args.thread_groups, False),
                         streams=_names(args.streams, True), engine=engine, baseline=plan,
                         num_iterations=min(iterations, 200), overheads=overheads, cores=args.cores)
    suggested = simulate(search.plan, costs, iterations, engine, None if engine == "clocked" else max_in_flight,
                         overheads=overheads, cores=args.cores)
    how_found = "exhaustive" if search.exhaustive else "local search"
    print(f"suggestion ({how_found}, {search.simulated} plans simulated, at most {max_in_flight} iterations alive):")
    if search.kept_baseline:
        print("no plan is predicted faster than the traced one by more than 0.5%: keep it")
    print(format_plan(search.plan) + "\n")
    print(format_comparison(["traced plan", "suggested"], [plan, search.plan], [traced, suggested], speedup_over=0))
    return 0


def _pairs(plan: PipelinePlan, which: str) -> List[Any]:
    deps = plan.intra if which == "intra" else plan.inter
    return [(t, d) for t in plan.task_names for d in deps[t]]


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
