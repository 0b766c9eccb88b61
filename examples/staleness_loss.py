"""What stale weights do to training: the same model trained at staleness k = 0, 1 and 2.

    python examples/staleness_loss.py [--out docs/staleness_loss.png]

A pipeline that runs the optimizer step of iteration i while the forward of iteration
i+1 already runs must give that forward weights that do not yet include step i:
``WeightVersions(model, staleness=k)`` gives the forward (and backward) of iteration i the
weights after the step of iteration i-k-1, and ``versions.deps(forward, step)`` is the
dependency that makes the forward wait for them. k = 0 is the plain training loop.

Here a small MLP learns a smooth function of 16 inputs (a fixed random "teacher" network
plus a little noise) with SGD and momentum, 200 steps of 64 samples, the same batches and
initial weights for each k. Each k runs through the most parallel placement it allows:

    k = 0:  Forward, Backward, Step on one stage        (the next forward needs this step)
    k = 1:  Forward | Backward | Step on stages 0, 1, 2  (each on its own thread and stream)
    k = 2:  the same placement, one more version stashed

Every run's final weights must be bitwise equal to ``run_serial`` of the same plan: the
answer depends on k only, not on the threads. The script prints the loss per k and
draws the loss against the step (a 10-step running mean over the raw values) to --out.
"""

import argparse
from pathlib import Path

import torch

from swpipeline import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule
from swpipeline.training.weights import WeightVersions

STEPS, BATCH, INPUTS = 200, 64, 16
LR, MOMENTUM = 0.015, 0.9
SMOOTH = 10  # steps in the running mean drawn over the raw losses

# stages of Forward, Backward, Step per staleness: the most parallel placement each k allows
# (a task may wait for one `distance` iterations back only if it is at most that many stages later)
PLACEMENTS = {0: (0, 0, 0), 1: (0, 1, 2), 2: (0, 1, 2)}


def make_data(seed=0):
    """STEPS batches (x, y) of y = teacher(x) + noise: learnable, and the same for every k."""
    gen = torch.Generator().manual_seed(seed)
    w1, w2 = torch.randn(INPUTS, 32, generator=gen) / INPUTS ** 0.5, torch.randn(32, 1, generator=gen) / 32 ** 0.5
    batches = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, INPUTS, generator=gen)
        y = torch.tanh(x @ w1) @ w2 + 0.05 * torch.randn(BATCH, 1, generator=gen)
        batches.append((x, y))
    return batches


def make_model():
    torch.manual_seed(1)  # the same initial weights for every k
    return torch.nn.Sequential(torch.nn.Linear(INPUTS, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                               torch.nn.Tanh(), torch.nn.Linear(64, 1))


def train(k, batches, serial=False):
    """Train a fresh model at staleness k; its final weights, the loss of every step and the versions' stats."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    versions = WeightVersions(model, staleness=k)
    losses = [None] * len(batches)

    def forward(ctx):
        x, y = ctx.batch
        with versions.use(ctx):  # the module computes with iteration i's version of the weights
            out = model(x)
        ctx.loss = torch.nn.functional.mse_loss(out, y)

    def backward(ctx):
        ctx.loss.backward()

    def step(ctx):
        versions.step(ctx, opt)  # the gradients onto the live weights, opt.step(), zero_grad(), publish
        losses[ctx.iter_idx] = ctx.loss.item()

    f, b, s = PipelineTask("Forward", forward), PipelineTask("Backward", backward), PipelineTask("Step", step)
    stages = PLACEMENTS[k]
    spread = len(set(stages)) > 1
    plan = PipelinePlan(
        schedule={task: TaskSchedule(stage=stage, thread_group=f"s{stage}" if spread else "default",
                                     stream=f"s{stage}" if spread else None)
                  for task, stage in zip((f, b, s), stages)},
        intra_iter_deps=[(b, f), (s, b)],
        inter_iter_deps=[versions.deps(f, s)],  # (Forward, Step, k + 1): the forward waits for its version
    )
    pipe = SWPipeline(plan, device="cpu")
    if serial:
        pipe.run_serial(batches)
    else:
        pipe.run(batches)
    stats = versions.stats()
    versions.close()
    return [p.detach().clone() for p in model.parameters()], losses, stats


def running_mean(values, n):
    return [sum(values[max(0, i - n + 1):i + 1]) / len(values[max(0, i - n + 1):i + 1]) for i in range(len(values))]


def draw(curves, path):
    """Loss against step for each k: raw losses faint, their running mean on top (matplotlib, Agg canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.2))
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    for (k, losses), colour in zip(curves.items(), ("tab:blue", "tab:orange", "tab:green")):
        steps = range(len(losses))
        ax.plot(steps, losses, color=colour, alpha=0.25, linewidth=0.8)
        ax.plot(steps, running_mean(losses, SMOOTH), color=colour, linewidth=1.8,
                label=f"k = {k}" + (" (the serial loop)" if k == 0 else f" (stages {PLACEMENTS[k]})"))
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (MSE)")
    ax.set_title(f"Staleness k: forward and backward of step i use the weights after step i-k-1\n"
                 f"MLP {INPUTS}-64-64-1, SGD lr {LR} momentum {MOMENTUM}, batch {BATCH}; "
                 f"faint: per step, bold: {SMOOTH}-step mean", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description="Train one model at staleness 0, 1 and 2; plot the losses.")
    parser.add_argument("--out", default="docs/staleness_loss.png", help="the PNG to write")
    args = parser.parse_args()
    torch.set_num_threads(1)
    batches = make_data()
    curves, rows, all_equal = {}, [], True
    for k in (0, 1, 2):
        weights, losses, stats = train(k, batches)
        serial_weights, serial_losses, _ = train(k, batches, serial=True)
        equal = all(torch.equal(a, b) for a, b in zip(weights, serial_weights)) and losses == serial_losses
        all_equal = all_equal and equal
        curves[k] = losses
        last = losses[-SMOOTH:]
        rows.append((k, str(PLACEMENTS[k]), f"{losses[0]:.4f}", f"{sum(last) / len(last):.4f}",
                     str(stats.peak_versions), "yes" if equal else "NO"))

    headers = ("k", "stages F,B,S", "loss step 0", f"loss last {SMOOTH} (mean)", "versions", "= run_serial")
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    for row in rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(row, widths)))

    try:
        draw(curves, args.out)
        print(f"loss against step written to {args.out}")
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): no figure written")
    print(f"final weights bitwise equal to run_serial: {'yes' if all_equal else 'NO'} (k = 0, 1, 2; {STEPS} steps)")
    assert all_equal, "a pipelined run must compute what run_serial of the same plan computes"


if __name__ == "__main__":
    main()
