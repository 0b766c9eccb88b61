"""torch.distributed.pipelining's 1F1B schedule, swapped for swpipeline's by changing one import (CPU, gloo).

    torchrun --nproc_per_node 2 examples/pipeline_parallel.py

Each rank holds one stage of an 8-block MLP. The same training loop runs twice from the
same weights, once with each library's PipelineStage and Schedule1F1B, for 5 SGD steps of 8
microbatches; each rank checks that its stage's weights end bitwise equal, and rank 0 prints
the whole pipeline's schedule, every rank side by side.
"""

import torch
import torch.distributed as dist
import torch.distributed.pipelining as torch_pp
from torch import nn

import swpipeline.pp as swp_pp  # the one changed line: from swpipeline.pp import PipelineStage, Schedule1F1B

BLOCKS, WIDTH, BATCH, MICROBATCHES, STEPS = 8, 64, 32, 8, 5


def train(library, rank, world):
    """The loop a torch.distributed.pipelining user writes; ``library`` provides PipelineStage and Schedule1F1B."""
    torch.manual_seed(0)  # the same whole model on every rank; each keeps its own blocks
    blocks = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(BLOCKS)]
    per = BLOCKS // world
    stage_module = nn.Sequential(*blocks[rank * per:(rank + 1) * per])
    stage = library.PipelineStage(stage_module, rank, world, torch.device("cpu"))
    schedule = library.Schedule1F1B(stage, MICROBATCHES, loss_fn=nn.functional.mse_loss)
    optimizer = torch.optim.SGD(stage_module.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x, y = torch.randn(BATCH, WIDTH, generator=data), torch.randn(BATCH, WIDTH, generator=data)
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y)
        else:
            schedule.step()
        optimizer.step()
    return [p.detach().clone() for p in stage_module.parameters()], schedule


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    theirs, _ = train(torch_pp, rank, world)
    ours, schedule = train(swp_pp, rank, world)
    same = all(torch.equal(a, b) for a, b in zip(theirs, ours))
    if rank == 0:
        schedule.print_schedule()
    dist.barrier()
    print(f"rank {rank}: weights after {STEPS} steps bitwise equal to torch.distributed.pipelining's: "
          f"{'yes' if same else 'NO'}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
