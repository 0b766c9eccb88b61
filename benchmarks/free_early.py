"""Memory held by in-flight contexts, with and without ``free_early``.

What is measured
    After every unit of work, the bytes of all tensors reachable from the contexts in
    flight (``pipe.contexts_in_flight()``; a storage shared by several tensors counts
    once); the table shows the peak over the run. Two plans:

    * ``4-stage``: A -> B -> C -> D, one stage and thread group each; A, B and C each
      leave a ``--mib`` MiB tensor on the context that only the next task reads; D reduces
      C's to a scalar (``out``, kept with ``keep=("out",)``);
    * ``demo``: the demo's plan (``swpipeline demo``: prepare, copy, forward, backward,
      optimizer step), whose tasks already ``del`` the batch copies they are done with;
      ``free_early`` gets its reads and writes from ``analyze(plan, batch)``.

    Measuring walks the contexts after every unit, so only memory is reported, not time.
    It measures at the end of each task, before the engine frees what that task was the
    last to use: the moment a task's output and its input both exist. So the free_early
    column is an upper bound.

Run: ``python benchmarks/free_early.py`` (about 10 s).
"""

from __future__ import annotations

import argparse
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

import swpipeline as swp
from _common import format_table, machine_line
from swpipeline.cli import demo
from swpipeline.engine.lifetime import tensors_in

MIB = 1 << 20


class PeakMeter:
    """Wraps task functions so that, after each, the bytes held by the live contexts are measured."""

    def __init__(self) -> None:
        self.pipe: Optional[Any] = None
        self.peak = 0
        self._lock = threading.Lock()

    def wrap(self, fn: Callable[[swp.IterContext], Any]) -> Callable[[swp.IterContext], Any]:
        def measured(ctx: swp.IterContext) -> None:
            fn(ctx)
            if self.pipe is not None:
                self.measure()
        return measured

    def measure(self) -> None:
        assert self.pipe is not None
        storages: Dict[int, int] = {}
        for ctx in self.pipe.contexts_in_flight():
            for value in list(vars(ctx).values()):
                for t in tensors_in(value):
                    storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        with self._lock:
            self.peak = max(self.peak, sum(storages.values()))


def measured_plan(plan: swp.PipelinePlan, meter: PeakMeter) -> swp.PipelinePlan:
    schedule = {swp.PipelineTask(t.name, meter.wrap(t.fn), t.io, t.reads, t.writes): plan.schedules[t.name]
                for t in plan.tasks}
    intra = [(task, dep) for task, deps in plan.intra.items() for dep in deps]  # by name: the tasks are new objects
    inter = [(task, dep) for task, deps in plan.inter.items() for dep in deps]
    return swp.PipelinePlan(schedule, intra, inter)


def four_stage(mib: float) -> swp.PipelinePlan:
    n = int(mib * MIB / 4)

    def a(ctx: swp.IterContext) -> None:
        ctx.a = torch.full((n,), float(ctx.batch))

    def b(ctx: swp.IterContext) -> None:
        ctx.b = ctx.a * 2

    def c(ctx: swp.IterContext) -> None:
        ctx.c = ctx.b + 1

    def d(ctx: swp.IterContext) -> None:
        ctx.out = ctx.c.sum()

    uses = {"A": ((), ("a",)), "B": (("a",), ("b",)), "C": (("b",), ("c",)), "D": (("c",), ("out",))}
    tasks = [swp.PipelineTask(name, fn, reads=uses[name][0], writes=uses[name][1])
             for name, fn in zip(uses, (a, b, c, d))]
    schedule = {t: swp.TaskSchedule(stage=k, thread_group=t.name, stream=t.name) for k, t in enumerate(tasks)}
    deps = [(tasks[1], tasks[0]), (tasks[2], tasks[1]), (tasks[3], tasks[2])]
    return swp.PipelinePlan(schedule, intra_iter_deps=deps)


def peak(plan: swp.PipelinePlan, data: List[Any], engine: str, free_early: Any, keep: Tuple[str, ...]) -> float:
    meter = PeakMeter()
    plan = measured_plan(plan, meter)
    kwargs: Dict[str, Any] = dict(free_early=free_early, keep=keep if free_early is not False else ())
    pipe: Any = (swp.SWPipeline(plan, device="cpu", **kwargs) if engine == "SWPipeline"
                 else swp.DataFlowPipeline(plan, max_depth=plan.depth, device="cpu", **kwargs))
    meter.pipe = pipe
    pipe.run(data)
    return meter.peak / MIB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=16.0, help="size of each large tensor in the 4-stage plan")
    parser.add_argument("--iters", type=int, default=40)
    args = parser.parse_args()
    print(machine_line())
    rows = []
    plan = four_stage(args.mib)
    for engine in ("SWPipeline", "DataFlowPipeline"):
        without = peak(plan, list(range(args.iters)), engine, False, ())
        with_free = peak(plan, list(range(args.iters)), engine, True, ("out",))
        rows.append((f"4-stage, {args.mib:g} MiB tensors", engine, f"{without:.1f}", f"{with_free:.1f}",
                     f"{100 * (1 - with_free / without):.0f}%"))
    cfg = demo.DemoConfig(iters=args.iters)
    job = demo.TrainingJob(cfg, swp.CPUDevice())
    batches = [demo.make_raw_batch(cfg, k) for k in range(args.iters)]
    analysis = swp.analyze(job.plan, batches[0])
    for engine in ("SWPipeline", "DataFlowPipeline"):
        without = peak(job.plan, batches, engine, False, ())
        with_free = peak(job.plan, batches, engine, analysis, ())
        rows.append(("demo", engine, f"{without:.2f}", f"{with_free:.2f}", f"{100 * (1 - with_free / without):.0f}%"))
    print(f"{args.iters} iterations; peak MiB held by the tensors of the contexts in flight")
    print(format_table(["plan", "engine", "without", "free_early", "saved"], rows, left=2))


if __name__ == "__main__":
    main()
