"""The quickstart's plan on the data-flow engine: what max_depth means.

    python examples/dataflow.py

SWPipeline hands out work one period (one clock tick) at a time: the prep thread runs at
most 2 batches ahead of training, and a slow read soon holds training up.
DataFlowPipeline(plan, max_depth=N) runs the same tasks, in the same order on each thread,
without the clock: up to N iterations are in flight (N live contexts: the memory it costs),
so the prep thread can run up to N-1 batches ahead. Here reading a batch takes 1 ms, every
5th batch 15 ms, and a training step 4 ms: a deeper buffer hides the slow reads.
"""

import time
from copy import deepcopy

import torch

from swpipeline import DataFlowPipeline, PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

device = "cpu"
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = [{"x": torch.randint(0, 256, (256, 64))} for _ in range(40)]
losses = {}


def prepare(ctx):
    time.sleep(0.015 if ctx.iter_idx % 5 == 4 else 0.001)  # stands for reading the batch from disk
    ctx.x = ctx.batch["x"].float() / 255
def copy(ctx):     ctx.x = ctx.x.to(device, non_blocking=True)
def forward(ctx):  ctx.loss = model(ctx.x).square().mean()
def backward(ctx): ctx.loss.backward()
def step(ctx):
    opt.step()
    opt.zero_grad()
    losses[ctx.iter_idx] = ctx.loss.detach()
    time.sleep(0.004)  # stands for a bigger model: training is the bottleneck, 4 ms a step


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


def train(run):
    """Train from the same initial weights; the loss of every iteration."""
    model.load_state_dict(start[0])
    opt.load_state_dict(start[1])
    losses.clear()
    seconds = run(loader)
    return seconds, torch.stack([losses[i] for i in range(len(loader))])


def main():
    torch.set_num_threads(1)  # one core per thread, so the timings compare the engines
    _, serial = train(SWPipeline(plan, device=device).run_serial)

    # The plan has 3 stages: SWPipeline keeps 3 iterations in flight. A max_depth the plan
    # cannot complete with is refused when the pipeline is built, naming the smallest that works.
    try:
        DataFlowPipeline(plan, max_depth=1, device=device)
    except ValueError as exc:
        print(f"DataFlowPipeline(plan, max_depth=1) is refused:\n  {exc}\n")

    print("engine                          live contexts  seconds  losses bitwise equal to serial")
    engines = [("SWPipeline (depth 3)", SWPipeline(plan, device=device))]
    engines += [(f"DataFlowPipeline(max_depth={n})", DataFlowPipeline(plan, max_depth=n, device=device))
                for n in (2, 3, 6)]
    for name, pipe in engines:
        seconds, got = train(pipe.run)
        equal = torch.equal(got, serial)
        print(f"{name:31s} {pipe.peak_live_contexts:13d} {seconds:8.3f}  {'yes' if equal else 'NO'}")
        assert equal, f"{name} must compute what the serial loop computes"
    print(f"(training alone takes {len(loader)} x 4 ms = {len(loader) * 0.004:.2f} s)")
    print(f"losses bitwise equal: yes (every engine, {len(loader)} iterations)")


if __name__ == "__main__":
    main()
