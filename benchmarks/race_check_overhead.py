"""What run-time race checking costs: task functions wrapped by RaceChecker vs the same functions bare.

What is measured
    The SparseDist-shaped plan of ``overhead.py`` (8 tasks over 3 stages, thread groups
    h2d / dist / default), where every task reads the context attribute of each of its
    intra-iteration dependencies and writes one of its own: 15 context accesses per
    iteration (8 writes, 7 reads). Three methods, each run with the bare functions and
    with ``RaceChecker(plan).wrap(task)``, interleaved within every repeat:

    * ``direct``: the tasks called in serial order on a fresh IterContext, no engine;
    * ``run_serial``: ``pipe.run_serial(range(iters))``;
    * ``run``: ``pipe.run(range(iters))`` (worker threads started and joined inside the timing).

How to read the table
    ``bare us/iter`` and ``checked us/iter`` are median wall times per iteration;
    ``overhead us/task`` = (checked - bare) / (iters x tasks) and ``us/access`` =
    (checked - bare) / (iters x accesses), both the median over repeats of the per-repeat
    difference. The checker adds, per call, a recording view and a dispatch mode on the
    calling thread (to see draws from random generators; these tasks run no torch
    operator, so none reaches it) and, per access, a few dict and list operations; the
    pipelined row also shows any extra contention between the threads. A task that runs
    torch operators also pays a Python call per operator while it is checked.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import swpipeline as swp
from _common import format_table, machine_line
from swpipeline import RaceChecker

# name, stage, thread group, stream
TASK_LAYOUT: List[Tuple[str, int, str, Optional[str]]] = [
    ("H2D", 0, "h2d", "memcpy"), ("InputDistStart", 1, "dist", "data_dist"), ("InputDistWait", 1, "dist", "data_dist"),
    ("ZeroGrad", 2, "default", None), ("WaitBatch", 2, "default", None), ("Forward", 2, "default", None),
    ("Backward", 2, "default", None), ("OptimizerStep", 2, "default", None),
]
INTRA_DEPS = [("InputDistStart", "H2D"), ("InputDistWait", "InputDistStart"), ("WaitBatch", "InputDistWait"),
              ("Forward", "WaitBatch"), ("Forward", "ZeroGrad"), ("Backward", "Forward"), ("OptimizerStep", "Backward")]
INTER_DEPS = [("ZeroGrad", "OptimizerStep"), ("Forward", "OptimizerStep")]
ACCESSES = len(TASK_LAYOUT) + len(INTRA_DEPS)  # one write per task, one read per intra dependency


def task_fn(name: str) -> Callable[[swp.IterContext], None]:
    """Reads each dependency's attribute, writes its own."""
    deps = [d for t, d in INTRA_DEPS if t == name]

    def fn(ctx: swp.IterContext) -> None:
        for dep in deps:
            getattr(ctx, dep)
        setattr(ctx, name, ctx.iter_idx)

    return fn


def build_plan(checked: bool) -> Tuple[swp.PipelinePlan, List[Callable[[swp.IterContext], Any]]]:
    """The plan, with bare or race-checked task functions; and the functions in serial order."""
    bare = swp.PipelinePlan({swp.PipelineTask(n, task_fn(n)): swp.TaskSchedule(stage=s, stream=st, thread_group=g)
                             for n, s, g, st in TASK_LAYOUT}, INTRA_DEPS, INTER_DEPS)
    if not checked:
        return bare, [t.fn for t in bare.tasks]
    checker = RaceChecker(bare)
    fns = {t.name: checker.wrap(t) for t in bare.tasks}
    plan = swp.PipelinePlan({swp.PipelineTask(t.name, fns[t.name]): bare.schedules[t.name] for t in bare.tasks},
                            INTRA_DEPS, INTER_DEPS)
    return plan, [fns[n] for n, _, _, _ in TASK_LAYOUT]


def timed(method: str, checked: bool, iters: int) -> float:
    plan, fns = build_plan(checked)
    start = time.perf_counter()
    if method == "direct":
        for i in range(iters):
            ctx = swp.IterContext(i, i)
            for fn in fns:
                fn(ctx)
    elif method == "run_serial":
        swp.SWPipeline(plan, device="cpu").run_serial(range(iters))
    else:
        swp.SWPipeline(plan, device="cpu").run(range(iters))
    return time.perf_counter() - start


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(machine_line())
    methods = ("direct", "run_serial", "run")
    times: Dict[Tuple[str, bool], List[float]] = {(m, c): [] for m in methods for c in (False, True)}
    for _ in range(args.repeats):
        for method in methods:
            for checked in (False, True):
                times[(method, checked)].append(timed(method, checked, args.iters))
    rows = []
    tasks = len(TASK_LAYOUT)
    for method in methods:
        bare, checked = times[(method, False)], times[(method, True)]
        extra = statistics.median(c - b for b, c in zip(bare, checked))
        rows.append([method, f"{statistics.median(bare) / args.iters * 1e6:.1f}",
                     f"{statistics.median(checked) / args.iters * 1e6:.1f}",
                     f"{extra / (args.iters * tasks) * 1e6:.2f}", f"{extra / (args.iters * ACCESSES) * 1e6:.2f}"])
    print(f"{tasks} tasks, {ACCESSES} context accesses per iteration, {args.iters} iterations, "
          f"median of {args.repeats}")
    print(format_table(["method", "bare us/iter", "checked us/iter", "overhead us/task", "us/access"], rows))


if __name__ == "__main__":
    main()
