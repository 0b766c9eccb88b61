"""Weight stashing: what putting forward, backward and the optimizer step on different stages buys.

What is measured
    One MLP (``--layers`` Linear(width, width) + ReLU, then Linear(width, 1), float32, batch
    ``--batch``, MSE loss against a random target, SGD with momentum) trained for ``--iters``
    iterations by a three-task plan::

        Forward  -> Backward -> Step        (intra deps (Backward, Forward), (Step, Backward))

    with ``torch.set_num_threads(1)``, so that threads, not torch's intra-op parallelism, are
    what runs work side by side (the matrix products release the GIL). The default sizes make
    the forward about 4 ms and the backward about 8 ms on this project's 2-core machine; the
    step is about 1 ms, plus the copy of the weights that ``WeightVersions.step`` publishes.

    The runs, on the same batches from the same initial weights:

    * ``serial loop``: a plain Python loop, forward / backward / step (no library); the baseline;
    * ``A (0,0,0)``: the three tasks on one stage and thread group, the plain optimizer, the plain
      dependency ``(Forward, Step)`` (staleness 0);
    * ``B (0,0,1)``: Step one stage later, on a thread group and stream of its own;
      ``WeightVersions(staleness=1)``, dependency ``(Forward, Step, 2)``;
    * ``C (0,1,1)``: Backward and Step on stage 1, on their own thread group and stream; staleness 1;
    * ``D (0,1,2)``: each task on a stage, thread group and stream of its own; staleness 2
      (dependency distance 3), and ``D (0,1,2) k=1``: the same placement at staleness 1, the
      least it allows (stage gap 2 <= distance 2);
    * ``B``/``C`` at staleness 0: the same placements with the plain dependency
      ``(Forward, Step)`` (legal: stage gap 1) and the plain optimizer: declaring that the next
      forward needs this step serializes the three tasks again, whatever the placement.

    through ``SWPipeline(plan).run(batches)`` (``--engine dataflow``:
    ``DataFlowPipeline(plan, max_depth=plan.depth)``, ``--max-depth`` to change it).

How to read the table
    ``it/s`` is ``--iters`` / wall time of one run (thread start and join included), the median
    over ``--repeats``; repeats interleave the runs so that machine drift hits them alike, and each
    run starts from a freshly built model and optimizer. ``speedup`` is the median of the per-repeat
    ratios against the serial loop of the same repeat. ``predicted`` is ``swpipeline.simulate`` of
    the plan with ``cores`` = this machine's CPUs, from the serial loop's median task times (the
    step of a versioned run also pays the weight copy, timed here): what the placement allows if
    the threads did not slow each other down. On two cores two threads of matrix products share
    memory bandwidth and caches, so expect the measured speedup somewhat below it.

    ``versions`` and ``MiB`` are ``WeightVersions.stats()`` after the run: the most stashed
    versions alive at once (besides the live parameters) and what they hold at the peak.
    ``= run_serial`` says whether the run's final weights are bitwise equal to those of
    ``pipe.run_serial`` of the same plan on a fresh model and optimizer built from the same seed
    (it is the staleness-k answer, whatever the engine and the timing: expect yes everywhere).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import traceback
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

import swpipeline as swp
from _common import format_table, machine_line, yes_no
from swpipeline.training.weights import WeightVersions

Batch = Tuple[torch.Tensor, torch.Tensor]
TASKS = ("Forward", "Backward", "Step")
SERIAL = "serial loop"


@dataclass(frozen=True)
class Placement:
    """Where the three tasks run, and the staleness (None: no WeightVersions, the plain dependency)."""

    name: str
    stages: Tuple[int, int, int]
    groups: Tuple[str, str, str]
    streams: Tuple[Optional[str], Optional[str], Optional[str]]
    staleness: Optional[int]

    @property
    def label(self) -> str:
        return f"{self.name} ({','.join(map(str, self.stages))})"

    @property
    def k(self) -> int:
        return 0 if self.staleness is None else self.staleness

    @property
    def dependency(self) -> str:
        return "(F, S)" if self.staleness is None else f"(F, S, {self.staleness + 1})"


PLACEMENTS: Dict[str, Placement] = {p.name + ("" if p.staleness is None else f"{p.staleness}"): p for p in [
    Placement("A", (0, 0, 0), ("default", "default", "default"), (None, None, None), None),
    Placement("B", (0, 0, 1), ("fb", "fb", "step"), ("fb", "fb", "step"), None),
    Placement("B", (0, 0, 1), ("fb", "fb", "step"), ("fb", "fb", "step"), 1),
    Placement("C", (0, 1, 1), ("f", "bs", "bs"), ("f", "bs", "bs"), None),
    Placement("C", (0, 1, 1), ("f", "bs", "bs"), ("f", "bs", "bs"), 1),
    Placement("D", (0, 1, 2), ("f", "b", "s"), ("f", "b", "s"), 1),
    Placement("D", (0, 1, 2), ("f", "b", "s"), ("f", "b", "s"), 2),
]}  # keyed A, B, B1, C, C1, D1, D2


@dataclass(frozen=True)
class Sizes:
    width: int
    layers: int
    batch: int
    lr: float
    momentum: float


def make_model(sizes: Sizes, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    mods: List[torch.nn.Module] = []
    for _ in range(sizes.layers):
        mods += [torch.nn.Linear(sizes.width, sizes.width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods, torch.nn.Linear(sizes.width, 1))


def make_optimizer(model: torch.nn.Module, sizes: Sizes) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=sizes.lr, momentum=sizes.momentum)


def make_batches(sizes: Sizes, n: int, seed: int) -> List[Batch]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(sizes.batch, sizes.width, generator=gen), torch.randn(sizes.batch, 1, generator=gen))
            for _ in range(n)]


def loss_of(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out, y)


# -- the serial loop (no library) ------------------------------------------------------------------

@dataclass
class LoopResult:
    seconds: float
    task_seconds: Dict[str, List[float]]  # per iteration
    weights: List[torch.Tensor]


def serial_loop(sizes: Sizes, batches: Sequence[Batch], seed: int) -> LoopResult:
    model = make_model(sizes, seed)
    opt = make_optimizer(model, sizes)
    times: Dict[str, List[float]] = {name: [] for name in TASKS}
    clock = time.perf_counter
    start = clock()
    for x, y in batches:
        t0 = clock()
        loss = loss_of(model(x), y)
        t1 = clock()
        loss.backward()
        t2 = clock()
        opt.step()
        opt.zero_grad()
        t3 = clock()
        times["Forward"].append(t1 - t0)
        times["Backward"].append(t2 - t1)
        times["Step"].append(t3 - t2)
    seconds = clock() - start
    return LoopResult(seconds, times, [p.detach().clone() for p in model.parameters()])


def copy_seconds(sizes: Sizes, seed: int, n: int = 20) -> float:
    """What publishing one version costs (``WeightVersions.step`` clones every parameter), the median of n."""
    params = list(make_model(sizes, seed).parameters())
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        with torch.no_grad():
            _ = [p.detach().clone() for p in params]
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


# -- the pipelined runs ----------------------------------------------------------------------------

class Training:
    """One placement's model, optimizer, WeightVersions (if any), tasks, plan and pipeline."""

    def __init__(self, placement: Placement, sizes: Sizes, seed: int, engine: str,
                 max_depth: Optional[int]) -> None:
        self.model = make_model(sizes, seed)
        self.opt = make_optimizer(self.model, sizes)
        self.versions = None if placement.staleness is None else WeightVersions(self.model,
                                                                                staleness=placement.staleness)
        fwd, bwd, step = (swp.PipelineTask(name, fn) for name, fn in zip(TASKS, (self.forward, self.backward,
                                                                                 self.step)))
        schedule = {task: swp.TaskSchedule(stage=stage, thread_group=group, stream=stream)
                    for task, stage, group, stream in zip((fwd, bwd, step), placement.stages, placement.groups,
                                                          placement.streams)}
        inter: List[Any] = [(fwd, step)] if self.versions is None else [self.versions.deps(fwd, step)]
        self.plan = swp.PipelinePlan(schedule, intra_iter_deps=[(bwd, fwd), (step, bwd)], inter_iter_deps=inter)
        if engine == "dataflow":
            self.pipe: Any = swp.DataFlowPipeline(self.plan, max_depth=max_depth or self.plan.depth, device="cpu")
        else:
            self.pipe = swp.SWPipeline(self.plan, device="cpu")

    def forward(self, ctx: swp.IterContext) -> None:
        x, y = ctx.batch
        if self.versions is None:
            out = self.model(x)
        else:
            with self.versions.use(ctx):
                out = self.model(x)
        ctx.loss = loss_of(out, y)

    def backward(self, ctx: swp.IterContext) -> None:
        ctx.loss.backward()

    def step(self, ctx: swp.IterContext) -> None:
        if self.versions is None:
            self.opt.step()
            self.opt.zero_grad()
        else:
            self.versions.step(ctx, self.opt)

    def weights(self) -> List[torch.Tensor]:
        return [p.detach().clone() for p in self.model.parameters()]

    def close(self) -> None:
        if self.versions is not None:
            self.versions.close()


@dataclass
class RunResult:
    seconds: float
    weights: List[torch.Tensor]
    peak_versions: Optional[int]
    peak_mib: Optional[float]


def pipelined(placement: Placement, sizes: Sizes, batches: Sequence[Batch], seed: int, engine: str,
              max_depth: Optional[int], serial: bool = False) -> RunResult:
    training = Training(placement, sizes, seed, engine, max_depth)
    try:
        seconds = training.pipe.run_serial(batches) if serial else training.pipe.run(batches)
        stats = None if training.versions is None else training.versions.stats()
        return RunResult(seconds, training.weights(), None if stats is None else stats.peak_versions,
                         None if stats is None else stats.peak_bytes / 2**20)
    finally:
        training.close()


def predicted_speedup(placement: Placement, sizes: Sizes, seed: int, engine: str, max_depth: Optional[int],
                      task_s: Dict[str, float], copy_s: float, iters: int) -> str:
    """simulate() of the plan from the serial loop's task times, as a speedup over those times' sum."""
    training = Training(placement, sizes, seed, engine, max_depth)
    training.close()
    costs = dict(task_s)
    if placement.staleness is not None:
        costs["Step"] += copy_s
    try:
        sim = swp.simulate(training.plan, costs, num_iterations=iters,
                           engine="dataflow" if engine == "dataflow" else "clocked",
                           max_depth=(max_depth or training.plan.depth) if engine == "dataflow" else None,
                           cores=os.cpu_count() or 1)
    except Exception as exc:  # reported in the table, not hidden
        return f"error: {type(exc).__name__}: {exc}"
    per_iter = sim.seconds / iters
    return f"{sum(task_s.values()) / per_iter:.2f}x"


# -- the table -------------------------------------------------------------------------------------

def machine_busy_seconds() -> Optional[float]:
    """CPU seconds every process of the machine has run so far (None where /proc/stat is not there)."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle, iowait = fields[3], fields[4]
    return (sum(fields[:8]) - idle - iowait) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--iters", type=int, default=60, help="iterations per run (default 60)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats per run (default 3)")
    parser.add_argument("--engine", choices=["swpipeline", "dataflow"], default="swpipeline",
                        help="SWPipeline (default) or DataFlowPipeline(plan, max_depth=plan.depth)")
    parser.add_argument("--max-depth", type=int, default=None,
                        help="the data-flow engine's max_depth (default: the plan's depth)")
    parser.add_argument("--width", type=int, default=512, help="Linear width (default 512)")
    parser.add_argument("--layers", type=int, default=3, help="Linear(width, width) layers (default 3)")
    parser.add_argument("--batch", type=int, default=256, help="batch size (default 256)")
    parser.add_argument("--lr", type=float, default=1e-3, help="SGD learning rate (default 1e-3)")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    parser.add_argument("--only", nargs="+", choices=sorted(PLACEMENTS), default=None,
                        help="run only these placements (default: all)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a few-second smoke run: 8 iterations, 1 repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.iters, args.repeats = 8, 1
    if args.iters < 1 or args.repeats < 1:
        parser.error(f"--iters and --repeats must be >= 1, got {args.iters} and {args.repeats}")

    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    print(f"load average (1/5/15 min): {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}; "
          f"torch threads: {torch.get_num_threads()}; CPUs: {os.cpu_count()}")
    print(machine_line())
    sizes = Sizes(args.width, args.layers, args.batch, args.lr, args.momentum)
    placements = [PLACEMENTS[key] for key in (args.only or PLACEMENTS)]
    batches = make_batches(sizes, args.iters, args.seed + 1)
    param_mib = sum(p.numel() * p.element_size() for p in make_model(sizes, args.seed).parameters()) / 2**20

    busy_start, own_start, wall_start = machine_busy_seconds(), own_cpu_seconds(), time.perf_counter()
    # warm-up: first calls, allocator, thread start
    serial_loop(sizes, batches[:3], args.seed)
    for placement in placements:
        pipelined(placement, sizes, batches[:3], args.seed, args.engine, args.max_depth)

    seconds: Dict[str, List[float]] = {SERIAL: []}
    first: Dict[str, RunResult] = {}
    task_samples: Dict[str, List[float]] = {name: [] for name in TASKS}
    errors: Dict[str, str] = {}
    for _ in range(args.repeats):
        loop = serial_loop(sizes, batches, args.seed)
        seconds[SERIAL].append(loop.seconds)
        for name in TASKS:
            task_samples[name] += loop.task_seconds[name]
        for key, placement in zip(args.only or PLACEMENTS, placements):
            if key in errors:
                continue
            try:
                result = pipelined(placement, sizes, batches, args.seed, args.engine, args.max_depth)
            except Exception as exc:  # reported below, with its traceback, not hidden
                errors[key] = f"{type(exc).__name__}: {exc}"
                print(f"\n{placement.label} staleness {placement.k} FAILED:")
                traceback.print_exc()
                continue
            seconds.setdefault(key, []).append(result.seconds)
            first.setdefault(key, result)
    task_s = {name: median(task_samples[name]) for name in TASKS}
    copy_s = copy_seconds(sizes, args.seed)

    print(f"\nStaleness: Forward -> Backward -> Step of an MLP ({sizes.layers} x Linear({sizes.width}, "
          f"{sizes.width}) + ReLU, Linear({sizes.width}, 1); batch {sizes.batch}; float32; "
          f"{param_mib:.2f} MiB of parameters; SGD momentum {sizes.momentum}), {args.iters} iterations, "
          f"median of {args.repeats} interleaved repeats, engine "
          f"{'DataFlowPipeline' if args.engine == 'dataflow' else 'SWPipeline'}")
    print(f"serial loop, median per task: forward {task_s['Forward'] * 1e3:.2f} ms, backward "
          f"{task_s['Backward'] * 1e3:.2f} ms, step {task_s['Step'] * 1e3:.2f} ms; copying a version "
          f"{copy_s * 1e3:.2f} ms")
    print()
    headers = ["run", "stages F,B,S", "groups", "staleness", "dep", "it/s", "speedup", "predicted", "versions",
               "MiB", "= run_serial"]
    rows = [[SERIAL, "--", "--", "0", "--", f"{args.iters / median(seconds[SERIAL]):.1f}", "1.00x", "1.00x",
             "--", "--", "--"]]
    for key, placement in zip(args.only or PLACEMENTS, placements):
        groups = str(len(set(placement.groups)))
        cells = [placement.label, ",".join(map(str, placement.stages)), groups, str(placement.k),
                 placement.dependency]
        if key in errors:
            rows.append(cells + ["FAILED", "--", "--", "--", "--", errors[key][:60]])
            continue
        ratios = [s / p for s, p in zip(seconds[SERIAL], seconds[key])]
        result = first[key]
        try:
            check = pipelined(placement, sizes, batches, args.seed, args.engine, args.max_depth, serial=True)
            equal = yes_no(len(check.weights) == len(result.weights)
                           and all(torch.equal(a, b) for a, b in zip(result.weights, check.weights)))
        except Exception as exc:
            equal = f"run_serial failed: {type(exc).__name__}: {exc}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            predicted = predicted_speedup(placement, sizes, args.seed, args.engine, args.max_depth, task_s, copy_s,
                                          args.iters)
        rows.append(cells + [f"{args.iters / median(seconds[key]):.1f}", f"{median(ratios):.2f}x", predicted,
                             "--" if result.peak_versions is None else str(result.peak_versions),
                             "--" if result.peak_mib is None else f"{result.peak_mib:.2f}", equal])
    print(format_table(headers, rows, left=2))
    end = os.getloadavg()
    print(f"\nload average at the end (1/5/15 min): {end[0]:.2f} / {end[1]:.2f} / {end[2]:.2f}")
    busy_end = machine_busy_seconds()
    if busy_start is not None and busy_end is not None:
        wall = time.perf_counter() - wall_start
        others = max(0.0, (busy_end - busy_start) - (own_cpu_seconds() - own_start))
        share = others / (wall * (os.cpu_count() or 1))
        print(f"other processes ran {others:.1f} CPU s of the {wall:.1f} s this took ({share:.0%} of the machine)"
              + ("" if share < 0.05 else ": the timings above shared the CPUs with them; rerun on a quiet machine"))


if __name__ == "__main__":
    main()
