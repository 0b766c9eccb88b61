"""Embedding cache: pipelined vs serial training steps per second, tables 10x and 100x larger than the cache.

What is measured
    A click model: one ``HostEmbeddingBag`` (Adagrad, ``--dim`` wide) whose pooled
    rows, with a few dense features, feed a three-layer MLP (SGD). Batches of
    ``--bags`` bags of 1..16 ids each, skewed towards low ids (``id = u**3 * rows``
    for uniform ``u``, so a few rows are hot and most are cold). The cache holds
    ``--cache-rows`` rows; the table has 10x and 100x as many.

    For each table size and each repeat: build the model from one seed, train
    ``--warmup`` batches (untimed), then time ``--steps`` more batches, once with
    ``run_serial`` (every task on this thread, one batch at a time) and once with
    ``run`` (the plan pipelined on the clocked engine: the swap plan and the swap on
    their own threads, overlapping the training). Both start from the same model
    and see the same batches, so their final tables must be bitwise equal
    ("same result"). Figures are medians over ``--repeats``.

    ``torch.set_num_threads(1)``: each thread uses one core (this machine has 2), so
    the overlap, not intra-op parallelism, is what the pipeline buys.

Columns
    hit rate, in/batch, out/batch: the cache's statistics in the pipelined run;
    serial, pipelined: steps/s; ideal: serial time over the busiest thread's share
    of it (stage times of the serial run: prep = H2D + compute swap, swap, default =
    training), at most the number of cores: the best the overlap could give; cores used: the process's CPU time
    over the wall time in the pipelined run (at most 2 here; less when other
    processes take the CPUs).

Then the pipelined run's statistics (time per stage) for the 100x table, and a text
trace of a traced run showing the swap of batch i+1 under the training of batch i.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, Dict, List, Tuple

import torch
import torch.nn.functional as F

from _common import format_table, machine_line, yes_no
from swpipeline.embcache import EmbCacheStats, EmbCacheTrainPipeline, HostEmbeddingBag, format_trace

Batch = Dict[str, torch.Tensor]
DENSE_FEATURES = 8


class ClickModel(torch.nn.Module):
    def __init__(self, rows: int, cache_rows: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.emb = HostEmbeddingBag(rows, dim, cache_rows=cache_rows, optimizer="adagrad", lr=0.01)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim + DENSE_FEATURES, hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def forward(self, batch: Batch) -> Tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([self.emb(batch["ids"], batch["offsets"]), batch["dense"]], dim=1)
        logits = self.mlp(x).squeeze(1)
        return F.binary_cross_entropy_with_logits(logits, batch["label"]), logits.detach()


def ids_of(batch: Batch) -> Dict[str, Tuple[torch.Tensor, torch.Tensor]]:
    return {"emb": (batch["ids"], batch["offsets"])}


def make_batches(count: int, rows: int, bags: int, seed: int) -> List[Batch]:
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        lengths = torch.randint(1, 17, (bags,), generator=gen)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]])
        ids = (torch.rand(int(lengths.sum()), generator=gen) ** 3 * rows).long()
        batches.append({"ids": ids, "offsets": offsets, "dense": torch.randn(bags, DENSE_FEATURES, generator=gen),
                        "label": torch.randint(0, 2, (bags,), generator=gen).float()})
    return batches


def build(rows: int, args: argparse.Namespace) -> Tuple[ClickModel, EmbCacheTrainPipeline]:
    torch.manual_seed(0)
    model = ClickModel(rows, args.cache_rows, args.dim, args.hidden)
    pipe = EmbCacheTrainPipeline(model, torch.optim.SGD(model.mlp.parameters(), lr=0.05), "cpu", ids_of=ids_of)
    return model, pipe


def timed_run(rows: int, batches: List[Batch], serial: bool,
              args: argparse.Namespace) -> Tuple[float, float, torch.Tensor, EmbCacheStats]:
    """Seconds for the timed batches, the process's CPU seconds meanwhile, the final table, the run's statistics."""
    model, pipe = build(rows, args)
    run = pipe.run_serial if serial else pipe.run
    run(batches[:args.warmup])
    start, cpu_start = time.perf_counter(), time.process_time()
    run(batches[args.warmup:])
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return seconds, cpu, model.emb.full_weight(), pipe.stats()


def ideal_speedup(stats: EmbCacheStats) -> float:
    """Serial time over the busiest thread's share of it (at most the core count), from a serial run's stage times."""
    by_stage = {s.stage: s.total for s in stats.stages}
    prep = by_stage["batch to device"] + by_stage["compute swap"]
    lanes = [by_stage["forward/backward/update"], by_stage["swap"], prep]
    return min(sum(lanes) / max(lanes), float(os.cpu_count() or 1))  # three threads share the cores


def measure(ratio: int, args: argparse.Namespace) -> Tuple[List[str], EmbCacheStats, EmbCacheStats]:
    rows = ratio * args.cache_rows
    batches = make_batches(args.warmup + args.steps, rows, args.bags, seed=ratio)
    serial_s, pipelined_s, cores, ideals, same = [], [], [], [], True
    serial_stats = pipelined_stats = None
    for _ in range(args.repeats):
        s_time, _, s_weight, serial_stats = timed_run(rows, batches, True, args)
        p_time, p_cpu, p_weight, pipelined_stats = timed_run(rows, batches, False, args)
        serial_s.append(s_time)
        pipelined_s.append(p_time)
        cores.append(p_cpu / p_time)
        ideals.append(ideal_speedup(serial_stats))
        same = same and torch.equal(s_weight, p_weight)
    assert serial_stats is not None and pipelined_stats is not None
    table = pipelined_stats.table("emb")
    serial, pipelined = statistics.median(serial_s), statistics.median(pipelined_s)
    row = [f"{rows:,}", f"{ratio}x", f"{args.cache_rows:,}", f"{table.unique / table.batches:.0f}",
           f"{table.hit_rate:.1%}", f"{table.swapped_in_per_batch:.0f}", f"{table.swapped_out_per_batch:.0f}",
           f"{args.steps / serial:.1f}", f"{args.steps / pipelined:.1f}", f"{serial / pipelined:.2f}x",
           f"{statistics.median(ideals):.2f}x", f"{statistics.median(cores):.2f}", yes_no(same)]
    return row, serial_stats, pipelined_stats


def show_trace(args: argparse.Namespace) -> None:
    rows = 100 * args.cache_rows
    _, pipe = build(rows, args)
    batches = make_batches(12, rows, args.bags, seed=100)
    with pipe.tracing():
        pipe.run(batches)
    timeline = pipe.timeline
    assert timeline is not None
    print(format_trace(timeline, 6, 8))
    if args.trace:
        timeline.save_chrome_trace(args.trace)
        print(f"(the whole traced run, as Chrome/Perfetto trace JSON: {args.trace})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-rows", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--bags", type=int, default=512)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trace", default=None, help="also write the traced run as Chrome/Perfetto JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(machine_line())
    print(f"cache {args.cache_rows:,} rows x {args.dim}, Adagrad; {args.bags} bags of 1-16 ids per batch; "
          f"{args.warmup} warm-up + {args.steps} timed steps, median of {args.repeats}\n")
    results: List[List[str]] = []
    stats: Dict[int, Any] = {}
    for ratio in (10, 100):
        row, serial_stats, pipelined_stats = measure(ratio, args)
        results.append(row)
        stats[ratio] = (serial_stats, pipelined_stats)
    print(format_table(["table rows", "table/cache", "cache rows", "distinct/batch", "hit rate", "in/batch",
                        "out/batch", "serial steps/s", "pipelined steps/s", "speedup", "ideal", "cores used",
                        "same result"],
                       results, left=1))
    for ratio in (100,):
        serial_stats, pipelined_stats = stats[ratio]
        print(f"\n{ratio}x table, serial run:\n{serial_stats}\n\n{ratio}x table, pipelined run:\n{pipelined_stats}")
    print("\ntrace of a pipelined run (100x table), batches 6..8:")
    show_trace(args)


if __name__ == "__main__":
    main()
