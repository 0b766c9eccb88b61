"""Driving the pipeline one step at a time: evaluate between steps, stop early.

    python examples/step_by_step.py

pipe.run(loader) is this loop: fill_pipeline() starts the threads and the first iterations,
each progress() retires the oldest iteration (pipe.last_context is its context), drain()
finishes what is in flight and joins the threads. progress(advance=False) holds the next
step back until advance(), so the model can be evaluated in between without a race.
"""

from copy import deepcopy

import torch
import torch.nn.functional as F

from swpipeline import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

device = "cpu"
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
opt = torch.optim.Adam(model.parameters(), lr=0.05)
w = torch.randn(16, 1)  # the model learns y = x @ w
xs = [torch.randint(0, 256, (64, 16)) for _ in range(1000)]
data = [{"x": x, "y": x.float() / 255 @ w} for x in xs]
losses = {}

def prepare(ctx):  ctx.x, ctx.y = ctx.batch["x"].float() / 255, ctx.batch["y"]
def copy(ctx):     ctx.x, ctx.y = ctx.x.to(device, non_blocking=True), ctx.y.to(device, non_blocking=True)
def forward(ctx):  ctx.loss = F.mse_loss(model(ctx.x), ctx.y)
def backward(ctx): ctx.loss.backward()
def step(ctx):
    opt.step()
    opt.zero_grad()
    losses[ctx.iter_idx] = ctx.loss.detach()

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


def main():
    start = (deepcopy(model.state_dict()), deepcopy(opt.state_dict()))
    held_out = torch.rand(256, 16).to(device)
    pipe = SWPipeline(plan, device=device)

    i = -1
    it = pipe.fill_pipeline(data)  # threads started, the first 3 iterations in flight
    while True:
        try:
            i = pipe.progress(it, advance=False)  # iteration i has trained; nothing newer starts yet
        except StopIteration:  # the data ran out
            break
        if i % 10 == 9:
            with torch.no_grad():  # safe: no task touches the model until advance()
                val = F.mse_loss(model(held_out), held_out @ w.to(device)).item()
            print(f"step {i + 1:3d}: train loss {pipe.last_context.loss.item():.4f}, held-out loss {val:.4f}")
            if val < 0.05:
                print(f"held-out loss below 0.05 after step {i + 1}: stopping")
                pipe.drain()  # finishes the iterations already in flight, joins the threads
                break
        pipe.advance()  # start the next step (fetches the next batch)

    trained = len(losses)  # drain() trained the batches already in flight: none is dropped
    print(f"trained on {trained} batches ({trained - i - 1} of them finished by drain())")

    # The same batches through the plain serial loop, from the same initial weights.
    pipelined = torch.stack([losses[k] for k in range(trained)])
    model.load_state_dict(start[0])
    opt.load_state_dict(start[1])
    losses.clear()
    pipe.run_serial(data[:trained])
    serial = torch.stack([losses[k] for k in range(trained)])
    equal = torch.equal(pipelined, serial)
    print(f"losses bitwise equal: {'yes' if equal else 'NO'} ({trained} iterations, serial vs step by step)")
    assert equal


if __name__ == "__main__":
    main()
