"""Pipeline efficiency: pipelined throughput vs the ideal 1 / T_bottleneck.

What is measured
    Each scenario is a chain of 3-4 stages with known costs that release the GIL:
    ``sleep`` stages call ``time.sleep(ms)``; a ``torch`` stage runs a loop of
    single-threaded fp32 matmuls calibrated to about ``ms`` milliseconds. Stage ``k``
    is one task at stage ``k`` on its own thread group and stream, depending on stage
    ``k - 1`` of the same iteration (no inter-iteration dependencies). At most one
    stage is torch compute: the reference machine has 2 cores.

    Every repeat runs ``pipe.run_serial(range(iters))``, then ``pipe.run(range(iters))``.
    Each task times its own body; the last stage also records when it finished each
    iteration.

Thread settings (see ``ThreadSetup``)
    ``torch.set_num_threads(1)`` is an OpenMP setting of the calling OS thread: the
    engine's worker threads do not inherit it (``torch.get_num_threads()`` there still
    says 1, but matmuls use every core). The torch stage therefore calls it again in
    its worker thread; ``--inherit-torch-threads`` skips that, to show the effect.
    ``--torch-cpu N`` pins the torch stage's worker to CPU N and every other thread off
    it (Linux), so that threads the engine wakes are not queued behind the matmuls.

How to read the tables
    Stage table: the mean cost of each stage body in the serial run and in the
    pipelined run (higher in the pipeline: the stages slowed each other down).

    Summary table, each column the median over repeats:

    * ``T_b``: the bottleneck, the largest *in-pipeline* stage cost (so that a stage
      slowed by its neighbours does not count against the engine's scheduling).
    * ``serial/it``, ``pipe/it``: wall time of ``run_serial`` / ``run`` per iteration.
    * ``speedup``: serial time / pipelined time; ``max``: serial/it / T_b.
    * ``eff``: ``iters * T_b / pipelined time``, the ideal ``1 / T_b`` throughput over
      the measured one for the *whole run*: it pays for filling and draining the
      pipeline and for starting its threads. ``met`` judges this one (>= 95%).
    * ``eff fill``: ``(sum(stage costs) + (iters - 1) * T_b) / pipelined time``: the
      best any pipeline can do on ``iters`` iterations (the first takes the full
      latency, each further one T_b), so the unavoidable fill is not counted.
    * ``eff steady``: ``T_b / slope``, ``slope = (end[iters-1] - end[depth-1]) / (iters - depth)``
      where ``end[i]`` is when the last stage finished iteration ``i``: the rate after
      the first ``depth`` iterations (the fill), without thread start-up or drain.
    * ``fill ms``: pipelined time minus ``iters * slope``: what filling, draining and
      starting/joining the threads cost in total.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch

import swpipeline as swp
from _common import format_table, machine_line, yes_no

TARGET_EFFICIENCY = 0.95


@dataclass(frozen=True)
class Stage:
    """One stage's work: ``kind`` is "sleep" or "torch", ``ms`` its nominal cost."""

    kind: str
    ms: float

    def __str__(self) -> str:
        return f"{self.kind} {self.ms:g} ms"


SCENARIOS: Dict[str, List[Stage]] = {
    "sleep-2-3-5": [Stage("sleep", 2), Stage("sleep", 3), Stage("sleep", 5)],
    "sleep-4x4-balanced": [Stage("sleep", 4)] * 4,
    "mixed-torch5-bottleneck": [Stage("sleep", 2), Stage("torch", 5), Stage("sleep", 3)],
    "mixed-torch3-4stages": [Stage("sleep", 2), Stage("torch", 3), Stage("sleep", 4), Stage("sleep", 5)],
}


class MatmulLoop:
    """Single-threaded torch compute: ``reps`` fp32 matmuls of ``size x size`` into a preallocated output."""

    def __init__(self, size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.size = size
        self.a = torch.randn(size, size, generator=generator)
        self.b = torch.randn(size, size, generator=generator)
        self.out = torch.empty(size, size)
        self.run(10)
        samples = []
        for _ in range(15):
            start = time.perf_counter()
            self.run(10)
            samples.append((time.perf_counter() - start) / 10)
        self.seconds_per_matmul = statistics.median(samples)

    def run(self, reps: int) -> None:
        for _ in range(reps):
            torch.mm(self.a, self.b, out=self.out)

    def reps_for(self, ms: float) -> int:
        return max(1, round(ms / 1e3 / self.seconds_per_matmul))


class ThreadSetup:
    """Thread settings: the main thread's, and what the torch stage applies once in its worker thread.

    Args:
        torch_threads: ``torch.set_num_threads`` value for the main thread.
        reapply_in_worker: also apply it in the torch stage's worker thread (it is not inherited).
        torch_cpu: CPU to pin the torch stage's worker to, or None; ``apply_to_main``
            then keeps the main thread (and the workers it starts) off that CPU.
    """

    def __init__(self, torch_threads: int, reapply_in_worker: bool, torch_cpu: Optional[int]) -> None:
        self.torch_threads = torch_threads
        self.reapply_in_worker = reapply_in_worker
        self.torch_cpu = torch_cpu
        self._seen = threading.local()

    def apply_to_main(self) -> None:
        torch.set_num_threads(self.torch_threads)
        if self.torch_cpu is not None:
            others = set(os.sched_getaffinity(0)) - {self.torch_cpu}
            if not others:
                raise ValueError(f"--torch-cpu {self.torch_cpu}: no other CPU is left for the other threads")
            os.sched_setaffinity(0, others)

    def ensure_torch_worker(self) -> None:
        """Apply the settings in the calling worker thread, once; the main thread is left alone."""
        if getattr(self._seen, "done", False) or threading.current_thread() is threading.main_thread():
            return
        if self.reapply_in_worker:
            torch.set_num_threads(self.torch_threads)
        if self.torch_cpu is not None:
            os.sched_setaffinity(0, {self.torch_cpu})
        self._seen.done = True

    def describe(self) -> str:
        threads = f"torch.set_num_threads({self.torch_threads}) in the main thread"
        threads += " and the torch worker" if self.reapply_in_worker else " only (--inherit-torch-threads)"
        cpu = ("no CPU pinning" if self.torch_cpu is None
               else f"torch worker pinned to CPU {self.torch_cpu}, other threads off it (--torch-cpu)")
        return f"{threads}; {cpu}"


@dataclass
class StageClock:
    """What the stage bodies record during one run: their durations and the last stage's end times."""

    durations: List[List[float]]
    sink_ends: List[float] = field(default_factory=list)

    def reset(self) -> None:
        for d in self.durations:
            d.clear()
        self.sink_ends.clear()


def make_stage_fn(index: int, stage: Stage, is_last: bool, clock: StageClock, matmul: MatmulLoop,
                  setup: ThreadSetup) -> Callable[[swp.IterContext], None]:
    """The task body of one stage: do its work and time it."""
    if stage.kind == "sleep":
        seconds = stage.ms / 1e3

        def work() -> None:
            time.sleep(seconds)
    elif stage.kind == "torch":
        reps = matmul.reps_for(stage.ms)

        def work() -> None:
            setup.ensure_torch_worker()
            matmul.run(reps)
    else:
        raise ValueError(f"stage kind must be 'sleep' or 'torch', got {stage.kind!r}")
    durations = clock.durations[index]
    sink_ends = clock.sink_ends

    def stage_fn(ctx: swp.IterContext) -> None:
        start = time.perf_counter()
        work()
        end = time.perf_counter()
        durations.append(end - start)
        if is_last:
            sink_ends.append(end)

    return stage_fn


def build_pipeline(stages: Sequence[Stage], clock: StageClock, matmul: MatmulLoop, setup: ThreadSetup,
                   device: str) -> swp.SWPipeline:
    """A chain: stage k is task 'S{k}' at stage k, thread group 'g{k}', stream 's{k}'."""
    last = len(stages) - 1
    schedule: Dict[Union[swp.PipelineTask, str], swp.TaskSchedule] = {
        swp.PipelineTask(f"S{k}", make_stage_fn(k, stage, k == last, clock, matmul, setup)):
            swp.TaskSchedule(stage=k, stream=f"s{k}", thread_group=f"g{k}")
        for k, stage in enumerate(stages)
    }
    intra = [(f"S{k}", f"S{k - 1}") for k in range(1, len(stages))]
    return swp.SWPipeline(swp.PipelinePlan(schedule, intra_iter_deps=intra), device=device)


@dataclass
class RepeatResult:
    """One repeat of one scenario; times in seconds."""

    serial_costs: List[float]
    pipelined_costs: List[float]
    serial_total: float
    pipelined_total: float
    steady_per_iter: float


def run_repeat(pipe: swp.SWPipeline, clock: StageClock, iters: int) -> RepeatResult:
    clock.reset()
    serial_total = pipe.run_serial(range(iters))
    serial_costs = [statistics.fmean(d) for d in clock.durations]
    clock.reset()
    pipelined_total = pipe.run(range(iters))
    pipelined_costs = [statistics.fmean(d) for d in clock.durations]
    ends, depth = clock.sink_ends, pipe.depth
    steady = (ends[-1] - ends[depth - 1]) / (iters - depth)
    return RepeatResult(serial_costs, pipelined_costs, serial_total, pipelined_total, steady)


@dataclass
class ScenarioSummary:
    """Medians over repeats of one scenario's numbers (times in ms, efficiencies as fractions)."""

    name: str
    stages: List[Stage]
    serial_ms: List[float]
    pipelined_ms: List[float]
    metrics: Dict[str, float]


def repeat_metrics(r: RepeatResult, iters: int) -> Dict[str, float]:
    """The summary columns for one repeat (see the module docstring)."""
    bottleneck, latency = max(r.pipelined_costs), sum(r.pipelined_costs)
    return {
        "T_b": bottleneck * 1e3,
        "serial/it": r.serial_total / iters * 1e3,
        "pipe/it": r.pipelined_total / iters * 1e3,
        "speedup": r.serial_total / r.pipelined_total,
        "max": r.serial_total / iters / bottleneck,
        "eff": iters * bottleneck / r.pipelined_total,
        "eff fill": (latency + (iters - 1) * bottleneck) / r.pipelined_total,
        "eff steady": bottleneck / r.steady_per_iter,
        "fill ms": (r.pipelined_total - iters * r.steady_per_iter) * 1e3,
    }


def summarize(name: str, stages: List[Stage], repeats: List[RepeatResult], iters: int) -> ScenarioSummary:
    per_repeat = [repeat_metrics(r, iters) for r in repeats]
    metrics = {key: statistics.median(m[key] for m in per_repeat) for key in per_repeat[0]}
    serial_ms = [statistics.median(c) * 1e3 for c in zip(*(r.serial_costs for r in repeats))]
    pipelined_ms = [statistics.median(c) * 1e3 for c in zip(*(r.pipelined_costs for r in repeats))]
    return ScenarioSummary(name, stages, serial_ms, pipelined_ms, metrics)


def measure_scenario(name: str, matmul: MatmulLoop, setup: ThreadSetup, iters: int, repeats: int,
                     device: str) -> ScenarioSummary:
    stages = SCENARIOS[name]
    clock = StageClock([[] for _ in stages])
    pipe = build_pipeline(stages, clock, matmul, setup, device)
    run_repeat(pipe, clock, max(2 * len(stages), 10))  # warm-up
    results = [run_repeat(pipe, clock, iters) for _ in range(repeats)]
    return summarize(name, stages, results, iters)


def stage_rows(summary: ScenarioSummary) -> List[List[str]]:
    return [[summary.name, str(k), str(stage), f"{s:.3f}", f"{p:.3f}"]
            for k, (stage, s, p) in enumerate(zip(summary.stages, summary.serial_ms, summary.pipelined_ms))]


def summary_row(summary: ScenarioSummary) -> List[str]:
    m = summary.metrics
    return [summary.name, str(len(summary.stages)), f"{m['T_b']:.3f}", f"{m['serial/it']:.3f}",
            f"{m['pipe/it']:.3f}", f"{m['speedup']:.2f}x", f"{m['max']:.2f}x", f"{m['eff']:.1%}",
            f"{m['eff fill']:.1%}", f"{m['eff steady']:.1%}", f"{m['fill ms']:.1f}",
            yes_no(m["eff"] >= TARGET_EFFICIENCY)]


def print_report(summaries: Sequence[ScenarioSummary], matmul: MatmulLoop, setup: ThreadSetup, iters: int,
                 repeats: int) -> None:
    print(f"Pipeline efficiency: one task per stage, each on its own thread group and stream; "
          f"{iters} iterations, median of {repeats} repeats")
    print(machine_line())
    print(f"torch stage: {matmul.size}x{matmul.size} fp32 matmul, {matmul.seconds_per_matmul * 1e3:.3f} ms "
          f"each (calibrated), repeated to the stage's ms; {setup.describe()}")
    print()
    headers = ["scenario", "stage", "work", "serial ms (mean)", "in pipeline ms (mean)"]
    print(format_table(headers, [row for s in summaries for row in stage_rows(s)], left=3))
    print()
    headers = ["scenario", "depth", "T_b ms", "serial/it ms", "pipe/it ms", "speedup", "max", "eff",
               "eff fill", "eff steady", "fill ms", f"met (eff >= {TARGET_EFFICIENCY:.0%})"]
    print(format_table(headers, [summary_row(s) for s in summaries]))


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--iters", type=int, default=200, help="iterations per run (default 200)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats per scenario (default 3)")
    parser.add_argument("--scenario", action="append", choices=list(SCENARIOS),
                        help="run only this scenario (repeatable; default all)")
    parser.add_argument("--matmul-size", type=int, default=256, help="torch stage matmul size (default 256)")
    parser.add_argument("--device", default="cpu", help="engine device (default cpu)")
    parser.add_argument("--inherit-torch-threads", action="store_true",
                        help="call torch.set_num_threads(1) in the main thread only, not in the torch worker")
    parser.add_argument("--torch-cpu", type=int, default=None, metavar="N",
                        help="pin the torch stage's worker thread to CPU N and every other thread off it (Linux)")
    args = parser.parse_args(argv)
    deepest = max(len(s) for s in SCENARIOS.values())
    if args.iters <= deepest or args.repeats < 1:
        parser.error(f"--iters must be > {deepest} (the deepest pipeline) and --repeats >= 1, "
                     f"got {args.iters} and {args.repeats}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    setup = ThreadSetup(1, not args.inherit_torch_threads, args.torch_cpu)
    setup.apply_to_main()
    matmul = MatmulLoop(args.matmul_size)
    names = args.scenario or list(SCENARIOS)
    summaries = [measure_scenario(n, matmul, setup, args.iters, args.repeats, args.device) for n in names]
    print_report(summaries, matmul, setup, args.iters, args.repeats)


if __name__ == "__main__":
    main()
