"""Engine overhead per task: no-op tasks through both engines vs a plain Python loop.

What is measured
    A TorchRec-SparseDist-shaped plan of 8 no-op tasks over 3 stages::

        stage 0: H2D                                   (stream "memcpy")
        stage 1: InputDistStart -> InputDistWait       (stream "data_dist")
        stage 2: ZeroGrad, WaitBatch -> Forward -> Backward -> OptimizerStep
                 (Forward also waits for ZeroGrad; Forward and ZeroGrad wait for
                  OptimizerStep of the previous iteration)

    in three configurations: every task in one thread group ("one-group"), the
    stages' tasks in three thread groups h2d / dist / default ("three-groups"), and
    those three groups with every task on the default stream ("shared-stream": tasks
    on one stream take turns, in the schedule's order, across the three threads),
    each run these ways on the same ``range(iters)`` data:

    * plain loop: ``for batch: ctx = IterContext(...); fn(ctx) for each task`` in serial order;
    * ``run_serial``: the engine's serial baseline (no threads);
    * ``run``: ``SWPipeline.run``: the last stage's thread group ("default") runs on the
      thread that calls ``run()``, every other group on a worker thread of its own;
    * ``run, all on workers``: the same with ``caller_thread_group=None``: every group on
      a worker thread, the caller only coordinates (``run``'s way before it took the last
      stage's group onto the caller's thread);
    * ``DataFlow run``: ``DataFlowPipeline(plan, max_depth=3).run`` (as many live
      iterations as the clock-driven engine; its ``run()`` too runs the last stage's group
      on the calling thread);
    * ``floor, workers``: no engine at all, only the thread hand-offs of a run with every
      group on a worker: each period the caller puts a token in every group's queue, the
      group's thread calls the no-op function once per task of the group, and the caller
      waits until the last stage's group has done the period;
    * ``floor, caller``: the same hand-offs when the caller runs the last stage's group
      itself: it puts a token in the other groups' queues, calls its own no-ops, and waits
      until the others have done the previous period (their units feed the next one).
    * ``floor, turns`` (shared-stream only): the hand-offs of turns alone: each period the
      turn goes from the caller to the dist thread, to the h2d thread, and back, each
      calling its no-ops in its turn (three strict hand-offs per period).
    The floors are what any design with those hand-offs pays on this machine.

How to read the table
    ``us/task`` is wall time / (iters * tasks). ``overhead`` is what a method adds
    per task over the plain loop: ``(t_method - t_plain) / (iters * tasks)``, taken
    per repeat and summarized as median and min over ``--repeats``. Repeats
    interleave the methods so that machine drift hits them alike. Pipelined times
    include starting and joining the worker threads (amortized over ``iters``).
    Targets: <= 2 us/task in one thread group, <= 5 us/task across three (on their own
    streams or sharing one), <= 5 us/task for the data-flow engine; ``met`` compares the
    *median* overhead with the target.

``--trace`` adds ``run(trace=True)``: what recording the timeline costs per task when
it is on (off, the ``run`` row, it costs nothing: the workers then run the same code as
without the feature).

``--profile`` runs one configuration's ``pipe.run`` under cProfile in every thread
(main and workers, merged) and prints the top functions by tottime instead of the table.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import queue
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import swpipeline as swp
from _common import format_table, machine_line, median_and_min, yes_no

# name, stage, thread group in the 3-group configuration, stream; listed in a serial (topological) order
TASK_LAYOUT: List[Tuple[str, int, str, Optional[str]]] = [
    ("H2D", 0, "h2d", "memcpy"),
    ("InputDistStart", 1, "dist", "data_dist"),
    ("InputDistWait", 1, "dist", "data_dist"),
    ("ZeroGrad", 2, "default", None),
    ("WaitBatch", 2, "default", None),
    ("Forward", 2, "default", None),
    ("Backward", 2, "default", None),
    ("OptimizerStep", 2, "default", None),
]
INTRA_DEPS = [
    ("InputDistStart", "H2D"),
    ("InputDistWait", "InputDistStart"),
    ("WaitBatch", "InputDistWait"),
    ("Forward", "WaitBatch"),
    ("Forward", "ZeroGrad"),
    ("Backward", "Forward"),
    ("OptimizerStep", "Backward"),
]
INTER_DEPS = [("ZeroGrad", "OptimizerStep"), ("Forward", "OptimizerStep")]

# configuration name -> (whether tasks keep their own thread groups, whether they keep their own streams,
# SWPipeline overhead target in us/task). "shared-stream": the three thread groups all on the default
# stream, whose units then take turns in the schedule's order, whatever thread reaches them first.
CONFIGS: Dict[str, Tuple[bool, bool, float]] = {"one-group": (False, True, 2.0), "three-groups": (True, True, 5.0),
                                                "shared-stream": (True, False, 5.0)}
DATAFLOW_TARGET_US = 5.0
PLAIN, SERIAL, RUN, WORKERS, DATAFLOW = "plain loop", "run_serial", "run", "run, all on workers", "DataFlow run"
FLOOR_WORKERS, FLOOR_CALLER, FLOOR_TURNS = "floor, workers", "floor, caller", "floor, turns"
TRACED = "run(trace=True)"
LAST_STAGE_GROUP = "default"


def noop(ctx: swp.IterContext) -> None:
    """The task body: nothing, so that only the engine's cost is left."""


def build_plan(spread_groups: bool, own_streams: bool = True) -> swp.PipelinePlan:
    """The SparseDist-shaped no-op plan, in one thread group or in three; with ``own_streams=False`` every
    task on the default stream (three groups then take turns on it: SharedStreamWarning, silenced here)."""
    schedule: Dict[Union[swp.PipelineTask, str], swp.TaskSchedule] = {
        swp.PipelineTask(name, noop): swp.TaskSchedule(stage=stage, stream=stream if own_streams else None,
                                                       thread_group=group if spread_groups else "default")
        for name, stage, group, stream in TASK_LAYOUT
    }
    return swp.PipelinePlan(schedule, intra_iter_deps=INTRA_DEPS, inter_iter_deps=INTER_DEPS)


def time_plain_loop(fns: Sequence[Callable[[swp.IterContext], Any]], iters: int) -> float:
    """Seconds for a plain loop calling every function once per iteration, in serial order."""
    start = time.perf_counter()
    for idx in range(iters):
        ctx = swp.IterContext(idx, idx)
        for fn in fns:
            fn(ctx)
    return time.perf_counter() - start


def time_turns_floor(units_per_group: Dict[str, int], iters: int) -> float:
    """Seconds for the hand-offs of thread groups that take turns on one stream, alone: each period the turn
    goes round the groups once (the caller runs the last stage's group), each thread calling its no-ops in
    its turn and handing the turn to the next thread. Three strict hand-offs per period, whatever the engine."""
    others = [g for g in units_per_group if g != LAST_STAGE_GROUP]
    ring = others + [LAST_STAGE_GROUP]
    turns = {group: threading.Semaphore(0) for group in ring}

    def serve(position: int) -> None:
        group, following = ring[position], ring[position + 1]
        count = units_per_group[group]
        for _ in range(iters):
            turns[group].acquire()
            for _ in range(count):
                noop(None)  # type: ignore[arg-type]
            turns[following].release()

    threads = [threading.Thread(target=serve, args=(k,)) for k in range(len(others))]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    first, own = turns[ring[0]], turns[LAST_STAGE_GROUP]
    for _ in range(iters):
        first.release()
        own.acquire()
        for _ in range(units_per_group[LAST_STAGE_GROUP]):
            noop(None)  # type: ignore[arg-type]
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


def time_handoff_floor(units_per_group: Dict[str, int], iters: int, caller_runs_last: bool) -> float:
    """Seconds for the thread hand-offs of a clock-driven run alone (the floors in the module docstring)."""
    on_workers = [g for g in units_per_group if not (caller_runs_last and g == LAST_STAGE_GROUP)]
    queues = {group: queue.SimpleQueue() for group in on_workers}  # type: ignore[var-annotated]
    finished = threading.Condition()
    done = {group: 0 for group in on_workers}  # the last period each worker's group has done

    def serve(group: str) -> None:
        get, count = queues[group].get, units_per_group[group]
        while True:
            period = get()
            if period is None:
                return
            for _ in range(count):
                noop(None)  # type: ignore[arg-type]
            with finished:
                done[group] = period
                finished.notify()

    # without the last group, the caller waits for it; with it, for the others' previous period
    awaited = [g for g in on_workers if g == LAST_STAGE_GROUP] if not caller_runs_last else on_workers
    lag = 1 if caller_runs_last else 0
    threads = [threading.Thread(target=serve, args=(group,)) for group in on_workers]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for period in range(1, iters + 1):
        for group_queue in queues.values():
            group_queue.put(period)
        if caller_runs_last:
            for _ in range(units_per_group[LAST_STAGE_GROUP]):
                noop(None)  # type: ignore[arg-type]
        with finished:
            while any(done[g] < period - lag for g in awaited):
                finished.wait()
    for group_queue in queues.values():
        group_queue.put(None)
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


@dataclass
class Engines:
    """The pipelines one configuration is timed with."""

    pipe: swp.SWPipeline
    workers: swp.SWPipeline
    dataflow: swp.DataFlowPipeline
    units_per_group: Dict[str, int]
    shared_stream: bool


def build_engines(spread_groups: bool, own_streams: bool, device: str) -> Engines:
    groups: Dict[str, int] = {}
    for _, _, group, _ in TASK_LAYOUT:
        key = group if spread_groups else LAST_STAGE_GROUP
        groups[key] = groups.get(key, 0) + 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", swp.SharedStreamWarning)
        return Engines(swp.SWPipeline(build_plan(spread_groups, own_streams), device=device),
                       swp.SWPipeline(build_plan(spread_groups, own_streams), device=device, caller_thread_group=None),
                       swp.DataFlowPipeline(build_plan(spread_groups, own_streams), max_depth=3, device=device),
                       groups, spread_groups and not own_streams)


def time_methods(engines: Engines, iters: int, traced: bool = False) -> Dict[str, float]:
    """One repeat: seconds for each method (and TRACED if asked), run back to back."""
    fns = [noop for _ in TASK_LAYOUT]
    data = range(iters)
    seconds = {
        PLAIN: time_plain_loop(fns, iters),
        SERIAL: engines.pipe.run_serial(data),
        RUN: engines.pipe.run(data),
        WORKERS: engines.workers.run(data),
        DATAFLOW: engines.dataflow.run(data),
        FLOOR_WORKERS: time_handoff_floor(engines.units_per_group, iters, caller_runs_last=False),
        FLOOR_CALLER: time_handoff_floor(engines.units_per_group, iters, caller_runs_last=True),
    }
    if engines.shared_stream:
        seconds[FLOOR_TURNS] = time_turns_floor(engines.units_per_group, iters)
    if traced:
        seconds[TRACED] = engines.pipe.run(data, trace=True)
    return seconds


@dataclass
class ConfigResult:
    """Every repeat's seconds per method for one configuration."""

    name: str
    target_us: float
    seconds: Dict[str, List[float]]


def measure_config(name: str, iters: int, repeats: int, device: str, traced: bool = False) -> ConfigResult:
    spread_groups, own_streams, target_us = CONFIGS[name]
    engines = build_engines(spread_groups, own_streams, device)
    time_methods(engines, min(iters, 300), traced)  # warm-up: imports, caches, first thread start
    seconds: Dict[str, List[float]] = {}
    for _ in range(repeats):
        for method, value in time_methods(engines, iters, traced).items():
            seconds.setdefault(method, []).append(value)
    return ConfigResult(name, target_us, seconds)


def result_rows(result: ConfigResult, iters: int) -> List[List[str]]:
    num_tasks = len(TASK_LAYOUT)
    per_task = {m: [s / (iters * num_tasks) * 1e6 for s in result.seconds[m]] for m in result.seconds}
    targets = {RUN: result.target_us, DATAFLOW: DATAFLOW_TARGET_US}
    rows = []
    for method in result.seconds:
        total_ms = median_and_min(result.seconds[method])[0] * 1e3
        cells = [result.name, method, f"{total_ms:.1f}", f"{total_ms * 1e3 / iters:.2f}",
                 f"{median_and_min(per_task[method])[0]:.3f}"]
        if method == PLAIN:
            rows.append(cells + ["--", "--", "--", "--"])
            continue
        overhead = [t - p for t, p in zip(per_task[method], per_task[PLAIN])]
        med, low = median_and_min(overhead)
        if method in targets:
            target, met = f"<= {targets[method]:g}", yes_no(med <= targets[method])
        else:
            target, met = "--", "--"
        rows.append(cells + [f"{med:.2f}", f"{low:.2f}", target, met])
    return rows


def print_table(results: Sequence[ConfigResult], iters: int, repeats: int) -> None:
    print(f"Engine overhead: {len(TASK_LAYOUT)} no-op tasks, 3 stages, {iters} iterations, "
          f"median of {repeats} repeats (min also shown)")
    print(machine_line())
    print()
    headers = ["config", "method", "total ms", "us/iter", "us/task", "overhead us/task", "min",
               "target", "met"]
    rows = [row for r in results for row in result_rows(r, iters)]
    print(format_table(headers, rows, left=2))


# -- profiling --------------------------------------------------------------------------------

def profile_all_threads(fn: Callable[[], Any]) -> List[cProfile.Profile]:
    """Run ``fn`` with cProfile enabled in this thread and in every thread it starts.

    Threads are hooked by wrapping ``threading.Thread.run`` for the duration of the call;
    returns one profile per thread, the calling thread's first.
    """
    main = cProfile.Profile()
    profiles = [main]
    original_run = threading.Thread.run

    def profiled_run(thread: threading.Thread) -> None:
        prof = cProfile.Profile()
        profiles.append(prof)
        prof.enable()
        try:
            original_run(thread)
        finally:
            prof.disable()

    setattr(threading.Thread, "run", profiled_run)
    try:
        main.enable()
        try:
            fn()
        finally:
            main.disable()
    finally:
        setattr(threading.Thread, "run", original_run)
    return profiles


def run_profile(config: str, iters: int, top: int, device: str) -> None:
    spread_groups, own_streams, _ = CONFIGS[config]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", swp.SharedStreamWarning)
        pipe = swp.SWPipeline(build_plan(spread_groups, own_streams), device=device)
    pipe.run(range(min(iters, 300)))  # warm-up outside the profile
    elapsed: List[float] = []
    profiles = profile_all_threads(lambda: elapsed.append(pipe.run(range(iters))))
    num_tasks = len(TASK_LAYOUT)
    print(f"cProfile of pipe.run, config {config!r}, {iters} iterations x {num_tasks} tasks, "
          f"{len(profiles)} threads merged; {elapsed[0] / (iters * num_tasks) * 1e6:.2f} us/task "
          f"under the profiler")
    print(machine_line())
    print("note: tottime of lock 'acquire' and SimpleQueue 'get' is time blocked waiting (idle), not CPU work")
    out = io.StringIO()
    stats = pstats.Stats(profiles[0], stream=out)
    for prof in profiles[1:]:
        stats.add(prof)
    stats.sort_stats(pstats.SortKey.TIME).print_stats(top)
    print(out.getvalue().strip("\n"))


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--iters", type=int, default=3000, help="iterations per run (default 3000)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats per method (default 5)")
    parser.add_argument("--device", default="cpu", help="engine device (default cpu)")
    parser.add_argument("--profile", nargs="?", const="one-group", choices=sorted(CONFIGS), default=None,
                        help="profile one configuration (default one-group) instead of printing the table")
    parser.add_argument("--top", type=int, default=25, help="functions shown by --profile (default 25)")
    parser.add_argument("--trace", action="store_true",
                        help="also time pipe.run(data, trace=True): the cost of recording a timeline")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.repeats < 1:
        parser.error(f"--iters and --repeats must be >= 1, got {args.iters} and {args.repeats}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    if args.profile is not None:
        run_profile(args.profile, args.iters, args.top, args.device)
        return
    results = [measure_config(name, args.iters, args.repeats, args.device, args.trace) for name in CONFIGS]
    print_table(results, args.iters, args.repeats)


if __name__ == "__main__":
    main()
