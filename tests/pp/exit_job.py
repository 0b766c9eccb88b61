"""Run by test_pp_exit.py on each of two ranks (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set): two
schedules' steps and ``measure()``, the process groups destroyed, then a plain exit, which must end with
status 0."""

import torch
import torch.distributed as dist
from torch import nn

import swpipeline.pp as pp


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    module = nn.Sequential(*[nn.Sequential(nn.Linear(512, 512), nn.ReLU()) for _ in range(4)])
    stage = pp.PipelineStage(module, rank, world, torch.device("cpu"))
    x, y = torch.randn(64, 512), torch.randn(64, 512)
    inputs = (x,) if rank == 0 else ()
    target = {"target": y} if rank == world - 1 else {}
    for name in ("ScheduleGPipe", "Schedule1F1B"):
        schedule = getattr(pp, name)(stage, 8, loss_fn=nn.functional.mse_loss)
        for _ in range(3):
            schedule.step(*inputs, **target)
        schedule.measure(*inputs, steps=5, **target)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
