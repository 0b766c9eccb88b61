"""Gradient clipping across pipeline stages: exact (swpipeline.pp.clip_grad_norm_) against the usual way (each rank's
norm raised to the power, summed over the ranks with one all_reduce, the root taken), on 2 gloo ranks.

For each model and seed, both clip the gradients of one 1F1B step (8 microbatches); the table gives how many of the
seeds' total norms equal the one-process ``torch.nn.utils.clip_grad_norm_`` bit for bit, the largest difference in
ulps, and the median time of one clipping call on the slower rank (20 calls per seed). Run:

    python benchmarks/pp_clip.py [--seeds 10]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported: one intra-op thread per rank

import argparse  # noqa: E402
import copy  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any, Dict, List, Tuple  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from _common import format_table, machine_line, on_two_ranks  # noqa: E402

MODELS = {"mlp 8x64": (8, 64), "mlp 8x512": (8, 512)}
N, BATCH = 8, 64


def make(blocks: int, width: int, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(blocks)])


def batch(width: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + seed)
    return torch.randn(BATCH, width, generator=gen), torch.randn(BATCH, width, generator=gen)


def usual_clip(params: List[torch.Tensor], max_norm: float, group: Any) -> torch.Tensor:
    """The usual way: this rank's total norm squared, summed over the ranks, its root."""
    local = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], 2.0)
    squared = local ** 2
    dist.all_reduce(squared, group=group)
    total = squared ** 0.5
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def rank_main(rank: int, world: int, port: int, seeds: int, out: Any) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    import swpipeline.pp as pp

    got: Dict[str, Any] = {}
    for name, (blocks, width) in MODELS.items():
        for seed in range(seeds):
            model = make(blocks, width, seed)
            per = blocks // world
            module = copy.deepcopy(nn.Sequential(*list(model)[rank * per:(rank + 1) * per]))
            stage = pp.PipelineStage(module, rank, world, torch.device("cpu"))
            schedule = pp.Schedule1F1B(stage, N, loss_fn=nn.functional.mse_loss)
            x, y = batch(width, seed)
            schedule.step(*([x] if rank == 0 else []), **(dict(target=y) if rank == world - 1 else {}))
            grads = [p.grad.clone() for p in module.parameters()]
            for way in ("exact", "usual"):
                times = []
                for _ in range(20):
                    for p, g in zip(module.parameters(), grads):
                        p.grad = g.clone()
                    dist.barrier()
                    start = time.perf_counter()
                    total = (pp.clip_grad_norm_(stage, 0.01) if way == "exact"
                             else usual_clip(list(module.parameters()), 0.01, None))
                    times.append((time.perf_counter() - start) * 1e3)
                got[(name, seed, way)] = (float(total), statistics.median(times))
    out.put((rank, got))
    dist.barrier()
    dist.destroy_process_group()


def one_process_total(blocks: int, width: int, seed: int) -> float:
    model = make(blocks, width, seed)
    x, y = batch(width, seed)
    for xm, ym in zip(torch.tensor_split(x, N), torch.tensor_split(y, N)):
        nn.functional.mse_loss(model(xm), ym).backward()
    for p in model.parameters():
        p.grad.div_(N)
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01))


def ulps(a: float, b: float) -> int:
    return abs(int(torch.tensor(a, dtype=torch.float32).view(torch.int32)) -
               int(torch.tensor(b, dtype=torch.float32).view(torch.int32)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    results = on_two_ranks(rank_main, args.seeds, timeout=600)
    rows = []
    for name, (blocks, width) in MODELS.items():
        want = [one_process_total(blocks, width, seed) for seed in range(args.seeds)]
        for way in ("exact", "usual"):
            totals = [results[0][(name, seed, way)][0] for seed in range(args.seeds)]
            same = sum(t == w for t, w in zip(totals, want))
            worst = max(ulps(t, w) for t, w in zip(totals, want))
            ms = statistics.median(max(results[r][(name, seed, way)][1] for r in (0, 1)) for seed in range(args.seeds))
            rows.append([name, "swpipeline.pp.clip_grad_norm_" if way == "exact" else "usual (all_reduce of squares)",
                         f"{same}/{args.seeds}", str(worst), f"{ms:.3f}"])
    print(machine_line())
    print(format_table(["model", "clipping", "equal to one process", "worst ulps", "ms per call"], rows, left=2))


if __name__ == "__main__":
    main()
