"""Quickstart: a small training loop as a 3-stage pipeline, checked against the plain loop.

    python examples/quickstart.py

Stage 0 prepares a batch on its own thread, stage 1 copies it to the device on a copy
stream, stage 2 trains. The same plan runs serially (the baseline) and pipelined, from
the same initial weights on the same batches, and both runs' losses must be bitwise equal.

It is the README's example as a script. Preparing a batch waits 3 ms, as reading it from
disk or the network would, so that the pipelined run has something to hide: it prepares
batch i+2 while batch i trains. (With tasks of a few microseconds there is nothing to
overlap, and the pipeline's own hand-offs make the pipelined run slightly slower than
the plain loop; it breaks even at about 10 microseconds per task.)
"""

import time
from copy import deepcopy

import torch

from swpipeline import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

device = "cpu"  # or "cuda"
model = torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = [{"x": torch.randint(0, 256, (256, 64))} for _ in range(40)]  # 40 batches of random "pixels"
losses = {}  # iteration -> loss, filled in by the last task


def read(batch):  # stands in for reading a batch from disk
    time.sleep(0.003)
    return batch


def prepare(ctx):  ctx.x = read(ctx.batch)["x"].float() / 255    # stage 0, its own thread
def copy(ctx):     ctx.x = ctx.x.to(device, non_blocking=True)     # stage 1, copy stream
def forward(ctx):  ctx.loss = model(ctx.x).square().mean()         # stage 2 ...
def backward(ctx): ctx.loss.backward()
def step(ctx):
    opt.step()
    opt.zero_grad()
    losses[ctx.iter_idx] = ctx.loss.detach()


# Every task has its own name. The plan gives each task its stage, thread group and
# stream, and says which task needs which within one iteration.
t = {f.__name__: PipelineTask(f.__name__, f) for f in (prepare, copy, forward, backward, step)}
plan = PipelinePlan(
    schedule={
        t["prepare"]: TaskSchedule(stage=0, thread_group="prep", stream="prep"),
        t["copy"]: TaskSchedule(stage=1, stream="copy"),
        t["forward"]: TaskSchedule(stage=2),
        t["backward"]: TaskSchedule(stage=2),
        t["step"]: TaskSchedule(stage=2),
    },
    intra_iter_deps=[(t["copy"], t["prepare"]), (t["forward"], t["copy"]),
                     (t["backward"], t["forward"]), (t["step"], t["backward"])],
)
start = (deepcopy(model.state_dict()), deepcopy(opt.state_dict()))


def train(run, batches):
    """Train from the initial weights; the seconds taken and the loss of every iteration."""
    model.load_state_dict(start[0])
    opt.load_state_dict(start[1])
    losses.clear()
    seconds = run(batches)
    return seconds, torch.stack([losses[i] for i in range(len(batches))])


def main():
    torch.set_num_threads(1)  # one core for preparation, one for training (for a fair timing on 2 cores)
    pipe = SWPipeline(plan, device=device)
    pipe.print_schedule(5)  # which task works on which iteration in each period

    train(pipe.run_serial, loader[:5])  # warm-up, so that neither timed run pays for first calls
    serial_s, serial = train(pipe.run_serial, loader)  # the plain loop: one batch at a time
    pipelined_s, pipelined = train(pipe.run, loader)  # batch i+2 is prepared while batch i trains

    print(f"serial:    {serial_s:.3f} s, loss {serial[0]:.6f} -> {serial[-1]:.6f}")
    print(f"pipelined: {pipelined_s:.3f} s, loss {pipelined[0]:.6f} -> {pipelined[-1]:.6f} "
          f"({serial_s / pipelined_s:.2f}x the plain loop's speed; at most about 2x, when reading and training "
          f"take equally long and each hides entirely behind the other)")
    equal = torch.equal(serial, pipelined)  # exact: the same bits, iteration by iteration
    print(f"losses bitwise equal: {'yes' if equal else 'NO'} ({len(loader)} iterations)")
    assert equal, "the pipelined run must compute what the serial loop computes"


if __name__ == "__main__":
    main()
