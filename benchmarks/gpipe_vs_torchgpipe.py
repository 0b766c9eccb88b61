"""GPipe training throughput: swpipeline.gpipe.GPipe next to torchgpipe's GPipe and the un-pipelined model.

What is measured
    A stack of ``--blocks`` blocks (Linear(width, width), ReLU, LayerNorm(width)) split
    into ``--partitions`` equal partitions on the CPU, and ``--chunks`` micro-batches per
    mini-batch of ``--batch`` samples. One *step* is a forward pass, ``output.square().mean()``
    and ``backward()`` (gradients set to None before each step; no optimizer). Variants,
    interleaved within every round so that they share the machine's load:

    * ``plain``: the un-partitioned ``nn.Sequential`` on the caller's thread;
    * ``plain, N threads``: the same with ``torch.set_num_threads(N)`` (intra-op parallelism
      instead of pipelining, for comparison; N = ``--partitions``);
    * ``torchgpipe``: torchgpipe 0.0.7's GPipe with ``devices=['cpu'] * partitions``;
    * ``swpipeline``: swpipeline.gpipe.GPipe with the same arguments;

    each with every ``--checkpoint`` mode. Torch work releases the GIL. Every thread
    runs torch with one intra-op thread (``OMP_NUM_THREADS=1`` is set before torch is
    imported, unless already set), so a variant uses as many cores as it has threads
    doing torch work at once: torchgpipe runs all CPU partitions on one worker thread
    (one per device), swpipeline one thread per partition.

Columns (median over ``--rounds`` rounds of ``--steps`` timed steps, after ``--warmup`` steps)
    ``ms/step``, ``samples/s``, ``vs plain`` = plain's ms/step / this one's, ``vs torchgpipe``
    = torchgpipe's ms/step / this one's (same checkpoint mode). The line after the table
    checks that swpipeline's output and gradients equal torchgpipe's bit for bit.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported: every thread's default

import argparse  # noqa: E402
import copy  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Callable, Dict, List, Tuple  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

from _common import format_table, machine_line, yes_no  # noqa: E402
from swpipeline.gpipe import GPipe  # noqa: E402


def build(blocks: int, width: int) -> nn.Sequential:
    torch.manual_seed(0)
    layers: List[nn.Module] = []
    for _ in range(blocks):
        layers += [nn.Linear(width, width), nn.ReLU(), nn.LayerNorm(width)]
    return nn.Sequential(*layers)


def train_step(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    for p in model.parameters():
        p.grad = None
    output = model(x)
    output.square().mean().backward()
    return output


def time_steps(step: Callable[[], object], steps: int, threads: int) -> float:
    """Seconds per step over ``steps`` steps, with ``threads`` intra-op threads on this thread."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        return (time.perf_counter() - start) / steps
    finally:
        torch.set_num_threads(saved)


def same_results(ours: nn.Module, theirs: nn.Module, x: torch.Tensor) -> bool:
    out_ours, out_theirs = train_step(ours, x), train_step(theirs, x)
    grads = zip((p.grad for p in ours.parameters()), (p.grad for p in theirs.parameters()))
    return torch.equal(out_ours, out_theirs) and all(a is not None and b is not None and torch.equal(a, b)
                                                     for a, b in grads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--checkpoint", nargs="+", default=["never", "except_last"],
                        choices=["always", "except_last", "never"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(machine_line())

    import torchgpipe  # imported here: the machine line comes first

    if args.blocks % args.partitions:
        parser.error(f"--blocks {args.blocks} must be a multiple of --partitions {args.partitions}")
    plain = build(args.blocks, args.width)
    balance = [3 * args.blocks // args.partitions] * args.partitions
    devices = ["cpu"] * args.partitions
    x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(1))
    variants: Dict[Tuple[str, str], Tuple[nn.Module, int]] = {("plain", "-"): (plain, 1),
                                                             (f"plain, {args.partitions} threads", "-"):
                                                                 (plain, args.partitions)}
    checks: List[str] = []
    for mode in args.checkpoint:
        theirs = torchgpipe.GPipe(copy.deepcopy(plain), balance, devices=devices, chunks=args.chunks, checkpoint=mode)
        ours = GPipe(copy.deepcopy(plain), balance, devices=devices, chunks=args.chunks, checkpoint=mode)
        variants[("torchgpipe", mode)] = (theirs, 1)
        variants[("swpipeline", mode)] = (ours, 1)
        checks.append(f"{mode}: {yes_no(same_results(ours, theirs, x))}")

    times: Dict[Tuple[str, str], List[float]] = {key: [] for key in variants}
    for (model, threads) in variants.values():
        time_steps(lambda: train_step(model, x), args.warmup, threads)
    for _ in range(args.rounds):
        for key, (model, threads) in variants.items():
            times[key].append(time_steps(lambda: train_step(model, x), args.steps, threads))

    median = {key: statistics.median(values) for key, values in times.items()}
    base = median[("plain", "-")]
    rows = []
    for (name, mode), seconds in median.items():
        reference = median.get(("torchgpipe", mode))
        vs_torchgpipe = f"{reference / seconds:.2f}x" if reference is not None else "-"
        rows.append([name, mode, f"{seconds * 1e3:.1f}", f"{args.batch / seconds:.0f}", f"{base / seconds:.2f}x",
                     vs_torchgpipe])
    print(f"\n{args.blocks} blocks of Linear({args.width}, {args.width}) + ReLU + LayerNorm, {args.partitions} "
          f"partitions (balance {balance}), batch {args.batch}, chunks {args.chunks}; forward + backward, median of "
          f"{args.rounds} rounds x {args.steps} steps\n")
    print(format_table(["variant", "checkpoint", "ms/step", "samples/s", "vs plain", "vs torchgpipe"], rows, left=2))
    print(f"\nswpipeline's output and gradients equal torchgpipe's bitwise: {', '.join(checks)}")
    print(f"load after the run: {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
