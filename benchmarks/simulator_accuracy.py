"""Simulator accuracy: predicted vs measured wall time of run(), and autoplan's plans measured.

What is measured
    For every case, the task costs come from one traced run (``run(data, trace=True)``,
    then ``TaskCosts.from_timeline``): each task's time in every iteration. The
    simulator then predicts the wall time of ``run()`` on the same batches, and the
    prediction is compared with the median of untraced runs. Cases:

    * ``demo``: the demo's click model (prep / copy / train threads), pipelined and serial;
    * ``efficiency``: every scenario of ``benchmarks/efficiency.py`` (sleep and torch stages);
    * ``jitter``: every row of ``benchmarks/jitter.py`` (both engines, max_depth 2-6, with and
      without jitter), all predicted from one traced ``SWPipeline`` run per cost sequence
      (the costs are the batches', whatever runs them), replaying the per-iteration jitter;
    * ``random``: random valid plans (3-7 tasks, up to 4 stages, 3 thread groups, 3 streams,
      random dependencies) of sleeping tasks (0.3-3 ms), on ``SWPipeline`` and on
      ``DataFlowPipeline`` (``max_depth`` = depth + 0..2), both predicted from one traced
      ``SWPipeline`` run;
    * ``autoplan`` (with ``demo``): the demo's tasks planned by ``autoplan`` from the traced
      costs (at most 3 iterations alive, thread groups default / prep / copy, 2 cores),
      predicted and measured against the hand-written plan;
    * ``torchrec`` (``--cases ...,torchrec``, needs TorchRec): TorchRec's SparseDist on 2 gloo
      ranks with a ``--read-ms`` read in ``H2D``; rank 0's traced costs, the plan ``autoplan``
      finds with every task but ``H2D`` pinned to the training thread and ``cores=1`` (the two
      ranks share the two cores), both predicted and measured over the timed steps.

    The engine's own costs are ``EngineOverheads()`` (constants measured on the reference
    machine); ``--overheads trace`` takes the wake-up latency and the per-unit cost from each
    traced run instead (``EngineOverheads.from_timeline``), ``--overheads calibrate`` what
    ``calibrate()`` measures at the start.

How to read the table
    ``measured ms``: the median of ``--repeats`` untraced ``run()`` calls (threads started and
    joined inside); ``predicted ms``: ``simulate(...).seconds``; ``error``: predicted /
    measured - 1. The target is |error| <= 10% for every case. Random plans are summarized
    (median and largest |error|, how many within 10%); ``--verbose`` lists each.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

import swpipeline as swp
from _common import format_table, machine_line, sleeper
from swpipeline.tuning.autoplan import search_plan
from swpipeline.tuning.calibrate import calibrate
from swpipeline.tuning.costs import TaskCosts
from swpipeline.tuning.overheads import EngineOverheads
from swpipeline.tuning.simulator import simulate

TARGET = 0.10
Pipeline = Any  # SWPipeline or DataFlowPipeline


@dataclass
class Row:
    case: str
    engine: str
    measured: float  # seconds: median of the untraced runs
    predicted: float  # seconds: median of the predictions, each from one traced run's costs
    traced: float = 0.0  # seconds: median of the traced runs' own wall times

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1

    @property
    def traced_error(self) -> float:
        return self.predicted / self.traced - 1 if self.traced else 0.0

    def cells(self) -> List[str]:
        ok = "yes" if abs(self.error) <= TARGET else "NO"
        return [self.case, self.engine, f"{self.measured * 1e3:.1f}", f"{self.predicted * 1e3:.1f}",
                f"{self.error:+.1%}", ok, f"{self.traced_error:+.1%}" if self.traced else "-"]


HEADERS = ["case", "engine", "measured ms", "predicted ms", "error", f"within {TARGET:.0%}", "vs traced run"]


def traced_costs(pipe: Pipeline) -> TaskCosts:
    """The costs recorded by ``pipe``'s last (traced) run."""
    timeline = pipe.timeline
    if timeline is None:
        raise RuntimeError("the last run was not traced")
    return TaskCosts.from_timeline(timeline)


def engine_of(pipe: Pipeline) -> Tuple[str, Optional[int]]:
    if isinstance(pipe, swp.DataFlowPipeline):
        return "dataflow", pipe.max_depth
    return "clocked", None


Overheads = Callable[[Any], EngineOverheads]  # the engine's own costs, given the traced run's timeline


def compare(case: str, pipe: Pipeline, data: Sequence[Any], repeats: int, overheads: Overheads,
            others: Sequence[Pipeline] = ()) -> Tuple[List[Row], TaskCosts]:
    """Predicted vs measured for ``pipe`` (and ``others``, the same plan on other engines), interleaved.

    Each repeat traces ``pipe`` once (the costs, and a traced wall time), predicts every
    pipeline's ``run()`` from those costs, then runs each untraced. Interleaving keeps a
    drifting machine from landing on the costs alone. Returns the rows and the last costs.
    """
    pipes = [pipe, *others]
    predicted: List[List[float]] = [[] for _ in pipes]
    measured: List[List[float]] = [[] for _ in pipes]
    traced: List[float] = []
    for _ in range(repeats):
        traced.append(pipe.run(data, trace=True))
        costs, engine_costs = traced_costs(pipe), overheads(pipe.timeline)
        for k, p in enumerate(pipes):
            engine, max_depth = engine_of(p)
            predicted[k].append(simulate(p.plan, costs, len(data), engine, max_depth,
                                         overheads=engine_costs).seconds)
            measured[k].append(p.run(data))
    rows = []
    for k, p in enumerate(pipes):
        engine, max_depth = engine_of(p)
        label = engine if max_depth is None else f"{engine} {max_depth}"
        rows.append(Row(case, label, statistics.median(measured[k]), statistics.median(predicted[k]),
                        statistics.median(traced) if k == 0 else 0.0))
    return rows, costs


# -- the demo -------------------------------------------------------------------------------------------------


def demo_case(args: argparse.Namespace, overheads: Overheads) -> Tuple[List[Row], List[Row], str]:
    """The demo pipelined and serial; then autoplan's plan of the demo's tasks, predicted and measured."""
    from swpipeline.cli.demo import DemoConfig, TrainingJob, make_raw_batch
    from swpipeline.devices.device import resolve_device

    cfg = DemoConfig(iters=args.demo_iters)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        job = TrainingJob(cfg, resolve_device("cpu"))
        batches = [make_raw_batch(cfg, k) for k in range(cfg.iters)]
        job.pipe.run(batches[:10])
        job.pipe.run_serial(batches[:10])
        rows, costs = compare("demo", job.pipe, batches, args.repeats, overheads)
        n = len(batches)
        serial = statistics.median(job.pipe.run_serial(batches) for _ in range(args.repeats))
        rows.append(Row("demo", "serial", serial,
                        simulate(job.plan, costs, n, "serial", overheads=overheads(None)).seconds))
        plan = job.plan
        intra = [(t, d) for t in plan.task_names for d in plan.intra[t]]
        # the hand-written plan relies on Forward(i) following OptimizerStep(i-1) on one thread; the planner
        # may separate them, so that dependency is declared
        search = search_plan(list(plan.tasks), intra, [("Forward", "OptimizerStep")], costs, max_in_flight=3,
                             thread_groups=["default", "prep", "copy"], baseline=plan, overheads=overheads(None),
                             num_iterations=min(n, 100), cores=os.cpu_count())
        suggested = swp.SWPipeline(search.plan, device="cpu")
        suggested.run(batches[:10])
        plans = [Row("demo: hand-written plan", "clocked", rows[0].measured, rows[0].predicted, rows[0].traced),
                 *compare("demo: autoplan's plan", suggested, batches, args.repeats, overheads)[0]]
        return rows, plans, search.format_report()
    finally:
        torch.set_num_threads(previous)


# -- benchmarks/efficiency.py and benchmarks/jitter.py ---------------------------------------------------------


def efficiency_case(args: argparse.Namespace, overheads: Overheads) -> List[Row]:
    import efficiency as eff

    setup = eff.ThreadSetup(1, True, None)
    setup.apply_to_main()
    matmul = eff.MatmulLoop(256)
    rows = []
    for name, stages in eff.SCENARIOS.items():
        clock = eff.StageClock([[] for _ in stages])
        pipe = eff.build_pipeline(stages, clock, matmul, setup, "cpu")
        pipe.run(range(10))
        rows += compare(f"efficiency {name}", pipe, range(args.iters), args.repeats, overheads)[0]
    # the scenario that the Linux scheduler slows down (see efficiency.py), with the torch thread pinned
    everywhere = os.sched_getaffinity(0)
    pinned = eff.ThreadSetup(1, True, 1)
    try:
        pinned.apply_to_main()
        stages = eff.SCENARIOS["mixed-torch3-4stages"]
        pipe = eff.build_pipeline(stages, eff.StageClock([[] for _ in stages]), matmul, pinned, "cpu")
        pipe.run(range(10))
        rows += compare("efficiency mixed-torch3-4stages, torch on CPU 1", pipe, range(args.iters), args.repeats,
                        overheads)[0]
    finally:
        os.sched_setaffinity(0, everywhere)
    return rows


def jitter_case(args: argparse.Namespace, overheads: Overheads) -> List[Row]:
    """Every row of jitter.py, each cost sequence traced once on SWPipeline and predicted for every engine."""
    import jitter as jit

    plan = jit.build_plan(jit.ComputeClock())
    iters = args.iters
    sequences = {"jitter": jit.jittered_costs(iters, 0, jit.DEFAULT_JITTER_PROB), "none": jit.steady_costs(iters)}
    rows = []
    for label, batches in sequences.items():
        traced = swp.SWPipeline(plan, device="cpu")
        flows = [jit.make_pipeline(c, plan, "cpu") for c in jit.configs()
                 if c.costs == label and c.max_depth is not None]
        for pipe in (traced, *flows):
            pipe.run(jit.steady_costs(10))
        found, costs = compare(f"jitter ({label})", traced, batches, args.repeats, overheads, flows)
        rows += found
        if label == "jitter":
            serial = statistics.median(traced.run_serial(batches) for _ in range(args.repeats))
            rows.append(Row(f"jitter ({label})", "serial", serial,
                            simulate(plan, costs, iters, "serial", overheads=overheads(None)).seconds))
    return rows


# -- random plans -------------------------------------------------------------------------------------------


def random_plan(rng: random.Random) -> swp.PipelinePlan:
    """A valid plan of 3-7 sleeping tasks with random stages, thread groups, streams and dependencies."""
    n = rng.randint(3, 7)
    names = [f"T{k}" for k in range(n)]
    stages = sorted(rng.randint(0, 3) for _ in range(n))
    shift = stages[0]
    stages = [s - shift for s in stages]
    schedule = {swp.PipelineTask(name, sleeper(rng.uniform(0.3e-3, 3e-3))):
                swp.TaskSchedule(stage=stages[k], stream=rng.choice([None, "s1", "s2"]),
                                 thread_group=rng.choice(["default", "g1", "g2"]))
                for k, name in enumerate(names)}
    intra = [(names[b], names[a]) for b in range(n) for a in range(b) if rng.random() < 0.35]
    inter = [(names[a], names[b]) for a in range(n) for b in range(n) if stages[b] - stages[a] <= 1
             and rng.random() < 0.1]
    return swp.PipelinePlan(schedule, intra, inter)


def random_case(args: argparse.Namespace, overheads: Overheads) -> List[Tuple[str, Row, Row]]:
    rng = random.Random(args.seed)
    out = []
    for k in range(args.random_plans):
        plan = random_plan(rng)
        max_depth = plan.depth + rng.randint(0, 2)
        with warnings.catch_warnings():  # random plans share streams between thread groups on purpose
            warnings.simplefilter("ignore", swp.SharedStreamWarning)
            clocked, flow = swp.SWPipeline(plan, device="cpu"), swp.DataFlowPipeline(plan, max_depth, device="cpu")
        for pipe in (clocked, flow):
            pipe.run(range(5))
        label = f"random #{k} ({len(plan.tasks)} tasks, depth {plan.depth})"
        rows, _ = compare(label, clocked, range(args.random_iters), args.random_repeats, overheads, [flow])
        out.append((label, rows[0], rows[1]))
    return out


def random_summary(results: List[Tuple[str, Row, Row]]) -> List[List[str]]:
    lines = []
    for k, engine in ((0, "clocked"), (1, "dataflow")):
        errors = [abs((a, b)[k].error) for _, a, b in results]
        within = sum(1 for e in errors if e <= TARGET)
        lines.append([f"random plans ({len(results)})", engine, f"{statistics.median(errors):.1%}",
                      f"{max(errors):.1%}", f"{within}/{len(errors)}"])
    return lines


# -- TorchRec SparseDist on 2 gloo ranks --------------------------------------------------------------------


def torchrec_rank(rank: int, world: int, port: int, args: argparse.Namespace, results: Any) -> None:
    """One rank: trace the hand-written SparseDist plan, plan from rank 0's costs, measure both plans."""
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        results.put((rank, torchrec_measure(rank, args, dist)))
    finally:
        dist.destroy_process_group()


def torchrec_measure(rank: int, args: argparse.Namespace, dist: Any) -> Dict[str, Any]:
    import torchrec_vs_ours as tvo

    import swpipeline.torchrec as ours
    from swpipeline.torchrec.pipeline import PlannedTrainPipeline

    tvo.READ_SECONDS = args.read_ms / 1e3
    steps, warmup = args.torchrec_steps, 5
    records = tvo.raw_records(rank, warmup + steps, 128)
    cpu = torch.device("cpu")

    def build(schedules: Optional[Dict[str, swp.TaskSchedule]] = None) -> Any:
        model, optimizer = tvo.build_model()
        pipe = ours.TrainPipelineSparseDist(model, optimizer, cpu, prepare_batch=tvo.prepare)
        if schedules is None:
            return pipe
        plan = pipe.plan
        replanned = swp.PipelinePlan({t: schedules[t.name] for t in plan.tasks},
                                     [(t, d) for t in plan.task_names for d in plan.intra[t]],
                                     [(t, d) for t in plan.task_names for d in plan.inter[t]])
        return PlannedTrainPipeline(replanned, pipe.runtime, cpu)

    def timed(pipe: Any) -> float:
        source = iter(records)
        for _ in range(warmup):
            pipe.progress(source)
        dist.barrier()
        start = time.perf_counter()
        while True:
            try:
                pipe.progress(source)
            except StopIteration:
                break
        return time.perf_counter() - start

    hand = build()
    with hand.engine.tracing():
        timed(hand)
    costs = TaskCosts.from_timeline(hand.engine.timeline, skip_first=warmup)
    plan = hand.plan
    box: List[Any] = [None]
    if rank == 0:
        search = search_plan(list(plan.tasks), [(t, d) for t in plan.task_names for d in plan.intra[t]],
                             [(t, d) for t in plan.task_names for d in plan.inter[t]], costs, max_in_flight=3,
                             thread_groups=["default", "prep"], baseline=plan, caller_thread_group="default",
                             pinned={n: "default" for n in plan.task_names if n != "H2D"},
                             num_iterations=warmup + steps, cores=1)  # 2 ranks share this machine's 2 cores
        box[0] = ({n: search.plan.schedules[n] for n in plan.task_names}, search.format_report(),
                  search.kept_baseline)
    dist.broadcast_object_list(box, src=0)
    schedules, report, kept = box[0]
    suggested_plan = build(schedules).plan

    def predicted(p: swp.PipelinePlan) -> float:
        r = simulate(p, costs, warmup + steps, caller_thread_group="default", cores=1)
        return r.retire_times[-1] - r.retire_times[warmup - 1]

    hand_times, suggested_times = [], []
    for _ in range(args.repeats):
        hand_times.append(timed(build()))
        if not kept:  # the same plan otherwise: nothing else to measure
            suggested_times.append(timed(build(schedules)))
    return {"hand": (statistics.median(hand_times), predicted(plan)),
            "suggested": (statistics.median(suggested_times or hand_times), predicted(suggested_plan)),
            "report": report, "costs": costs.format(), "kept": kept}


def torchrec_case(args: argparse.Namespace) -> Tuple[List[Row], str]:
    import multiprocessing
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=torchrec_rank, args=(r, 2, port, args, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=1800) for _ in procs)
    for p in procs:
        p.join()
    out = got[0]
    case = f"torchrec SparseDist ({args.read_ms:g} ms read per batch)"
    rows = [Row(f"{case}: hand-written plan", "clocked", *out["hand"])]
    if not out["kept"]:
        rows.append(Row(f"{case}: autoplan's plan", "clocked", *out["suggested"]))
    return rows, f"costs (rank 0):\n{out['costs']}\n\n{out['report']}"


# -- speed ---------------------------------------------------------------------------------------------------


def speed_line() -> str:
    names = [f"T{k}" for k in range(10)]
    schedule = {name: swp.TaskSchedule(stage=k // 3, stream=f"s{k % 4}", thread_group=f"g{k % 4}")
                for k, name in enumerate(names)}
    plan = swp.PipelinePlan(schedule, [(b, a) for a, b in zip(names, names[1:])])
    costs = {name: 1e-3 * (1 + k % 3) for k, name in enumerate(names)}
    timings = []
    for engine in ("clocked", "dataflow"):
        start = time.perf_counter()
        simulate(plan, costs, 10_000, engine)
        timings.append(f"{engine} {time.perf_counter() - start:.2f} s")
    return "simulating 10,000 iterations of a 10-task plan (4 thread groups, 4 stages): " + ", ".join(timings)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--cases", default="demo,efficiency,jitter,random", help="comma-separated cases to run")
    parser.add_argument("--iters", type=int, default=200, help="iterations per run (efficiency, jitter)")
    parser.add_argument("--demo-iters", type=int, default=200, help="iterations per demo run")
    parser.add_argument("--repeats", type=int, default=3, help="measured runs per case (median)")
    parser.add_argument("--random-plans", type=int, default=50)
    parser.add_argument("--random-iters", type=int, default=60)
    parser.add_argument("--random-repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overheads", choices=["default", "trace", "calibrate"], default="default",
                        help="the engine's own costs: the documented constants (default), wake-ups and per-unit "
                             "cost measured in each traced run, or calibrate() once at the start")
    parser.add_argument("--verbose", action="store_true", help="list every random plan")
    parser.add_argument("--torchrec-steps", type=int, default=40, help="timed steps per TorchRec run")
    parser.add_argument("--read-ms", type=float, default=5.0, help="I/O wait per batch in the TorchRec case")
    args = parser.parse_args(argv)
    cases = set(args.cases.split(","))
    print("Simulator accuracy: predicted vs measured wall time of run()")
    print(machine_line())
    constants = calibrate() if args.overheads == "calibrate" else EngineOverheads()

    def overheads(timeline: Any) -> EngineOverheads:
        if args.overheads == "trace" and timeline is not None:
            return EngineOverheads.from_timeline(timeline, constants)
        return constants

    how = "wake and unit measured in each traced run, the rest: " if args.overheads == "trace" else ""
    print(f"engine overheads: {args.overheads} ({how}{constants.format()})")
    print(speed_line())
    rows: List[Row] = []
    plan_rows: List[Row] = []
    report = ""
    if "demo" in cases:
        demo_rows, plan_rows, report = demo_case(args, overheads)
        rows += demo_rows
    if "efficiency" in cases:
        rows += efficiency_case(args, overheads)
    if "jitter" in cases:
        rows += jitter_case(args, overheads)
    headers = HEADERS
    print()
    print(format_table(headers, [r.cells() for r in rows], left=2))
    if "random" in cases:
        results = random_case(args, overheads)
        print()
        print(format_table(["case", "engine", "median |error|", "max |error|", f"within {TARGET:.0%}"],
                           random_summary(results), left=2))
        if args.verbose:
            print(format_table(headers, [r.cells() for _, a, b in results for r in (a, b)], left=2))
    if "torchrec" in cases:
        torchrec_rows, torchrec_report = torchrec_case(args)
        plan_rows += torchrec_rows
        report += "\n\n" + torchrec_report
    if plan_rows:
        print()
        print(format_table(headers, [r.cells() for r in plan_rows], left=2))
        print()
        print(report)
    print()
    print(machine_line().splitlines()[0].replace("python", "after the runs: python", 1))


if __name__ == "__main__":
    main()
