"""A calling thread that runs two stages: how soon the next period reaches the worker.

What is measured
    ``run()`` runs the thread group of the plan's last stage on the calling thread. When
    that group also has tasks at an earlier stage, each period runs, on the calling thread,
    the oldest iteration's last units and then the newer iteration's earlier ones::

        Prep   stage 0, thread group "prep", its own stream   (a worker thread)
        Fwd    stage 0, the default group                       (the calling thread)
        Bwd    stage 0, the default group
        Opt    stage 1, the default group                       Fwd(i) also waits for Opt(i - 1)

    with Fwd after Prep, Bwd after Fwd and Opt after Bwd in each iteration; every body a
    ``time.sleep`` (Prep 4 ms, Fwd 1.2, Bwd 2, Opt 0.8: 4 ms per iteration on each thread).
    In period ``p`` the calling thread runs Opt(p - 1), then Fwd(p) and Bwd(p); iteration
    ``p - 1`` is done once Opt(p - 1) is, and the next period (Prep(p + 1)) can be handed out
    then. An engine that hands it out only after the calling thread's whole period leaves
    the Prep thread idle while Fwd and Bwd run: about 7-7.7 ms per iteration instead of 4.

    The table gives, median of ``--repeats`` runs of ``--iters`` iterations each: the serial
    loop (``run_serial``), ``SWPipeline.run()``, ``DataFlowPipeline(max_depth=2).run()``, and
    the simulator's prediction for each (``simulate``, default overheads).

Run: ``python benchmarks/caller_stages.py`` (about 15 s).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import swpipeline as swp
from _common import format_table, machine_line, sleeper
from swpipeline.tuning.simulator import simulate

COSTS_MS: Dict[str, float] = {"Prep": 4.0, "Fwd": 1.2, "Bwd": 2.0, "Opt": 0.8}


def build_plan() -> swp.PipelinePlan:
    tasks = {name: swp.PipelineTask(name, sleeper(ms / 1000)) for name, ms in COSTS_MS.items()}
    schedule = {tasks["Prep"]: swp.TaskSchedule(stage=0, stream="prep", thread_group="prep"),
                tasks["Fwd"]: swp.TaskSchedule(stage=0), tasks["Bwd"]: swp.TaskSchedule(stage=0),
                tasks["Opt"]: swp.TaskSchedule(stage=1)}
    intra = [(tasks["Fwd"], tasks["Prep"]), (tasks["Bwd"], tasks["Fwd"]), (tasks["Opt"], tasks["Bwd"])]
    return swp.PipelinePlan(schedule, intra_iter_deps=intra, inter_iter_deps=[(tasks["Fwd"], tasks["Opt"])])


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--iters", type=int, default=200, help="iterations per run (default 200)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per method, the median is shown (default 3)")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.repeats < 1:
        parser.error("--iters and --repeats must be positive")
    plan = build_plan()
    costs = {name: ms / 1000 for name, ms in COSTS_MS.items()}
    # name: (how to run it, the engine and max_depth the simulator models it with)
    methods: Dict[str, Tuple[Callable[[range], float], str, Optional[int]]] = {
        "serial": (swp.SWPipeline(plan).run_serial, "serial", None),
        "SWPipeline.run()": (swp.SWPipeline(plan).run, "clocked", None),
        "DataFlowPipeline(max_depth=2).run()": (swp.DataFlowPipeline(plan, max_depth=2).run, "dataflow", 2)}
    print(f"a calling thread with two stages: Prep on a worker, Fwd + Bwd (stage 0) and Opt (stage 1) on the "
          f"calling thread; {args.iters} iterations, median of {args.repeats}")
    print(machine_line())
    print()
    seconds: Dict[str, List[float]] = {name: [] for name in methods}
    for _ in range(args.repeats):  # interleaved, so that drift hits every method alike
        for name, (run, _, _) in methods.items():
            seconds[name].append(run(range(args.iters)))
    serial = statistics.median(seconds["serial"])
    rows = []
    for name, (_, engine, depth) in methods.items():
        measured = statistics.median(seconds[name])
        predicted = simulate(plan, costs, args.iters, engine, depth).seconds
        rows.append([name, f"{measured / args.iters * 1e3:.2f}", f"{serial / measured:.2f}x",
                     f"{predicted / args.iters * 1e3:.2f}", f"{(predicted - measured) / measured * 100:+.1f}%"])
    print(format_table(["method", "ms/iteration", "speedup", "simulated ms/iteration", "simulated vs measured"],
                       rows))


if __name__ == "__main__":
    main()
