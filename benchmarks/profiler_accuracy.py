"""How accurately TaskProfiler recovers known task costs.

A chain of tasks with injected costs (sleeps of 0.5, 1, 2 and 4 ms, which release
the GIL, and a single-threaded torch matmul loop of about 3 ms) runs through
``TaskProfiler.profile``. The truth for each task is the median of its own body's
duration, timed inside the task during the same profiling run (a 1 ms sleep
really takes ~1.06 ms). A task passes when its exposed time is within 10% or
0.1 ms of the truth, whichever is larger.

Run: ``python benchmarks/profiler_accuracy.py [--measure N] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

from swpipeline import IterContext, PipelinePlan, PipelineTask, SWPipeline, TaskProfiler, TaskSchedule


def sleep_body(ms: float) -> Callable[[], None]:
    return lambda: time.sleep(ms / 1000)


def matmul_body(target_ms: float) -> Callable[[], None]:
    a = torch.randn(256, 256)
    start = time.perf_counter()
    for _ in range(20):
        a @ a
    per = (time.perf_counter() - start) / 20
    reps = max(1, round(target_ms / 1000 / per))

    def body() -> None:
        for _ in range(reps):
            a @ a
    return body


def timed_task(name: str, body: Callable[[], None], durations: Dict[str, List[float]]) -> PipelineTask:
    def fn(ctx: IterContext) -> None:
        start = time.perf_counter()
        body()
        durations[name].append(time.perf_counter() - start)
        setattr(ctx, name, True)
    return PipelineTask(name, fn)


def build(durations: Dict[str, List[float]]) -> SWPipeline:
    bodies = {"Sleep0.5ms": sleep_body(0.5), "Sleep1ms": sleep_body(1), "Sleep2ms": sleep_body(2),
              "Sleep4ms": sleep_body(4), "Matmul3ms": matmul_body(3)}
    tasks = [timed_task(name, body, durations) for name, body in bodies.items()]
    plan = PipelinePlan({t: TaskSchedule() for t in tasks}, intra_iter_deps=list(zip(tasks[1:], tasks)))
    return SWPipeline(plan, device="cpu")


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", type=int, default=20, help="iterations per timed round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per measurement (median)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    durations: Dict[str, List[float]] = {}
    pipe = build(durations)
    for name in pipe.plan.task_names:
        durations[name] = []
    result = TaskProfiler(pipe).profile(None, num_warmup=5, num_measure=args.measure, num_rounds=args.rounds)
    print(f"TaskProfiler accuracy: {args.rounds} rounds x {args.measure} iterations per measurement, "
          f"torch {torch.__version__}, torch threads 1")
    print(f"baseline serial iteration: {result.baseline_s * 1e3:.3f} ms "
          f"(sum of task truths {sum(statistics.median(d) for d in durations.values()) * 1e3:.3f} ms)\n")
    header = f"{'task':<12} {'truth ms':>9} {'exposed ms':>11} {'error ms':>9} {'error %':>8}  within 10% or 0.1 ms"
    print(header)
    print("-" * len(header))
    for name in pipe.plan.task_names:
        truth = statistics.median(durations[name])
        exposed = result.exposed_s[name]
        error = exposed - truth
        ok = abs(error) <= max(0.1 * truth, 1e-4)
        print(f"{name:<12} {truth * 1e3:>9.3f} {exposed * 1e3:>11.3f} {error * 1e3:>+9.3f} "
              f"{100 * error / truth:>+7.1f}%  {'yes' if ok else 'NO'}")


if __name__ == "__main__":
    main()
