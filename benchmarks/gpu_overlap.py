"""Copy/compute overlap on a GPU: serial vs SWPipeline vs DataFlowPipeline vs a hand-written two-stream loop.

What is measured
    Each iteration copies a pinned host batch to the GPU (``--copy-mb`` MiB) and runs a
    chain of matmuls on it (about ``--compute-ms`` ms). Four ways:

    * serial: copy then compute, on the default stream (``pipe.run_serial``);
    * SWPipeline / DataFlowPipeline: ``H2D`` on a "copy" stream and thread group at
      stage 0, ``Compute`` on the default stream at stage 1 (with ``--aux``, a third task
      on its own "aux" stream reads the copied batch too);
    * hand-written: the loop users write today, prefetching batch i+1 on a side stream
      while batch i computes, with an event and ``record_stream``.

    Per-iteration time is the CUDA-event time of the whole run / iterations (after one
    warm-up run of each). ``copy hidden`` = (serial - method) / copy-alone time: 100%
    means the copy costs nothing. ``peak MiB`` is ``torch.cuda.max_memory_allocated``
    during the run, which shows what keeping cross-stream tensors alive costs.

Run: ``python benchmarks/gpu_overlap.py`` (needs a CUDA GPU; prints why not otherwise).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable, Dict, List

import torch

import swpipeline as swp
from _common import format_table, machine_line


def make_compute(width: int, layers: int) -> Callable[[torch.Tensor], torch.Tensor]:
    weights = [torch.randn(width, width, device="cuda") / width ** 0.5 for _ in range(layers)]

    def compute(x: torch.Tensor) -> torch.Tensor:
        h = x
        for w in weights:
            h = torch.tanh(h @ w)
        return h.sum()

    return compute


def cuda_time(fn: Callable[[], None]) -> float:
    """Seconds of GPU time from a start event to an end event around ``fn`` (all streams joined)."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    torch.cuda.synchronize()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def build_plan(compute: Callable[[torch.Tensor], torch.Tensor], aux: bool, out: List[torch.Tensor]
               ) -> swp.PipelinePlan:
    def h2d(ctx: swp.IterContext) -> None:
        ctx.x = ctx.batch.to("cuda", non_blocking=True)

    def work(ctx: swp.IterContext) -> None:
        out.append(compute(ctx.x))

    def side(ctx: swp.IterContext) -> None:
        out.append(ctx.x.float().mean())

    copy, comp = swp.PipelineTask("H2D", h2d), swp.PipelineTask("Compute", work)
    schedule = {copy: swp.TaskSchedule(stage=0, stream="copy", thread_group="io"), comp: swp.TaskSchedule(stage=1)}
    intra = [(comp, copy)]
    if aux:
        extra = swp.PipelineTask("Aux", side)
        schedule[extra] = swp.TaskSchedule(stage=1, stream="aux", thread_group="aux")
        intra.append((extra, copy))
    return swp.PipelinePlan(schedule, intra_iter_deps=intra)


def hand_written(batches: List[torch.Tensor], compute: Callable[[torch.Tensor], torch.Tensor],
                 out: List[torch.Tensor]) -> None:
    copy_stream = torch.cuda.Stream()
    main = torch.cuda.current_stream()

    def fetch(batch: torch.Tensor) -> Any:
        with torch.cuda.stream(copy_stream):
            x = batch.to("cuda", non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
        return x, ready

    nxt = fetch(batches[0])
    for k in range(len(batches)):
        x, ready = nxt
        if k + 1 < len(batches):
            nxt = fetch(batches[k + 1])
        main.wait_event(ready)
        x.record_stream(main)
        out.append(compute(x))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--copy-mb", type=float, default=64.0)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8, help="matmuls per iteration (sets the compute time)")
    parser.add_argument("--aux", action="store_true", help="a third task on its own stream reads the batch too")
    args = parser.parse_args()
    print(machine_line())
    if not torch.cuda.is_available():
        print("gpu_overlap.py needs a CUDA GPU; none is available here.")
        return 0
    print(f"GPU: {torch.cuda.get_device_name()}, {args.iters} iterations, copy {args.copy_mb:g} MiB per iteration")
    rows_per_batch = int(args.copy_mb * (1 << 20) / 4 / args.width)
    batches = [torch.randn(rows_per_batch, args.width).pin_memory() for _ in range(4)]
    data = [batches[k % 4] for k in range(args.iters)]
    compute = make_compute(args.width, args.layers)
    out: List[torch.Tensor] = []

    copy_alone = cuda_time(lambda: [b.to("cuda", non_blocking=True) for b in data]) / args.iters
    warm = data[0].to("cuda")
    compute_alone = cuda_time(lambda: [compute(warm) for _ in data]) / args.iters
    plan = build_plan(compute, args.aux, out)
    methods: Dict[str, Callable[[], None]] = {
        "serial": lambda: swp.SWPipeline(plan, device="cuda").run_serial(data),
        "SWPipeline": lambda: swp.SWPipeline(plan, device="cuda").run(data),
        "DataFlowPipeline(3)": lambda: swp.DataFlowPipeline(plan, 3, device="cuda").run(data),
        "hand-written": lambda: hand_written(data, compute, out),
    }
    rows = []
    timings: Dict[str, float] = {}
    for name, run in methods.items():
        run()  # warm-up
        torch.cuda.synchronize()  # the hand-written loop leaves its last work queued: not this run's wall time
        out.clear()
        torch.cuda.reset_peak_memory_stats()
        wall = time.perf_counter()
        timings[name] = cuda_time(run) / args.iters
        wall = (time.perf_counter() - wall) / args.iters
        peak = torch.cuda.max_memory_allocated() / (1 << 20)
        rows.append((name, timings[name], wall, peak))
    serial = timings["serial"]
    table = [(name, f"{t * 1e3:.3f}", f"{w * 1e3:.3f}", f"{serial / t:.2f}x",
              f"{100 * (serial - t) / copy_alone:.0f}%", f"{peak:.0f}") for name, t, w, peak in rows]
    print(f"copy alone {copy_alone * 1e3:.3f} ms/iter, compute alone {compute_alone * 1e3:.3f} ms/iter")
    print(format_table(["method", "ms/iter (GPU)", "ms/iter (wall)", "speedup", "copy hidden", "peak MiB"], table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
