"""Run under torchrun by test_pp_torchrun.py: steps of Schedule1F1B forever, until Ctrl-C.

Each rank prints ``rank R stepping`` once its first step is done, then steps on (each
forward made slow, so the interrupt lands inside a step). On KeyboardInterrupt, or the
PipelineRankError of a peer's interrupt that reached it first, it prints ``rank R stopped:
<error type>[ from rank P's <its error type>]; pipeline threads left: [...]`` and exits with
130; any other error ends it with 1.
"""

import sys
import threading
import time

import torch
import torch.distributed as dist
from torch import nn

import swpipeline.pp as pp


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    stage_module = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    stage_module.register_forward_hook(lambda *a: time.sleep(0.05))
    stage = pp.PipelineStage(stage_module, rank, world, torch.device("cpu"))
    schedule = pp.Schedule1F1B(stage, 4, loss_fn=nn.functional.mse_loss, timeout=60.0)
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    steps = 0
    try:
        while True:
            schedule.step(*((x,) if rank == 0 else ()), **({"target": y} if rank == world - 1 else {}))
            steps += 1
            if steps == 1:
                print(f"rank {rank} stepping", flush=True)
    except (KeyboardInterrupt, pp.PipelineRankError) as exc:  # its own interrupt, or its peer's, come first
        left = [t.name for t in threading.enumerate() if t.name.startswith("swp-")]
        cause = f" from rank {exc.rank}'s {exc.error.split(':')[0]}" if isinstance(exc, pp.PipelineRankError) else ""
        print(f"rank {rank} stopped: {type(exc).__name__}{cause}; pipeline threads left: {left}", flush=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
