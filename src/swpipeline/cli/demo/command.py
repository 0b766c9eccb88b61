"""``swpipeline demo``: its options, and the run from them to the printed comparison.

``add_arguments`` and ``run`` are what ``cli/__init__.py`` dispatches to; ``run_demo`` is the demo
itself, for a config and a device: print the plan, train serially and pipelined, print
the comparison and write the outputs.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from typing import List, Optional

import torch

from ..args import int_at_least
from ...devices.device import Device, machine_accelerator, resolve_device
from .config import DemoConfig
from .data import make_raw_batch, raw_batch_bytes
from .job import TrainingJob
from .outputs import DemoOutputs, check_output_path, write_outputs
from .report import (SCHEDULE_HEADING, SCHEDULE_PERIODS, format_interference, format_loss_check, format_results,
                     format_speedup_basis, format_thread_split)
from .runs import timed_run

__all__: List[str] = []


SEED_LIMIT = 2**62  # batch k's generator is seeded with seed + k, which torch takes as a 64-bit integer

COMMAND_HELP = ("Train a small DLRM-style click model twice from the same initial weights, serially and "
                "pipelined, print both speeds and check that the per-iteration losses are equal. The "
                "pipelined run's trace and pictures are written under out/ unless told otherwise.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``swpipeline demo`` options to ``parser``."""
    defaults = DemoConfig()
    parser.add_argument("--iters", type=int_at_least(1), default=defaults.iters,
                        help=f"timed training iterations per mode (default {defaults.iters})")
    parser.add_argument("--batch-size", type=int_at_least(1), default=defaults.batch_size,
                        help=f"samples per batch (default {defaults.batch_size})")
    parser.add_argument("--warmup-iters", type=int_at_least(0), default=defaults.warmup_iters,
                        help=f"untimed iterations before each timed run (default {defaults.warmup_iters})")
    parser.add_argument("--device", default=None,
                        help="'cpu', 'cuda', 'cuda:1', ... (default: the accelerator if there is one, else the CPU)")
    parser.add_argument("--seed", type=int_at_least(-SEED_LIMIT, SEED_LIMIT), default=defaults.seed,
                        help=f"seed of the initial weights; batch k comes from seed + k (default {defaults.seed})")
    outputs = DemoOutputs()
    parser.add_argument("--trace", default=outputs.trace, metavar="PATH",
                        help=f"write the pipelined run's Chrome/Perfetto trace JSON here (default {outputs.trace}; "
                             f"'' to skip)")
    parser.add_argument("--chart", default=outputs.chart, metavar="PATH",
                        help=f"draw its timeline as a PNG Gantt chart here (default {outputs.chart}; needs "
                             f"matplotlib; '' to skip)")
    parser.add_argument("--schedule-chart", default=outputs.schedule_chart, metavar="PATH",
                        help=f"draw the period schedule as a PNG here (default {outputs.schedule_chart}; '' to skip)")


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    """The DemoConfig for parsed ``swpipeline demo`` arguments."""
    return replace(DemoConfig(), iters=args.iters, batch_size=args.batch_size,
                   warmup_iters=args.warmup_iters, seed=args.seed)


def run(args: argparse.Namespace) -> int:
    """Run the demo for parsed arguments; returns 0 when both runs' losses are equal, else 1 (2: a bad device,
    or an output path that cannot be written)."""
    cfg = config_from_args(args)
    outputs = DemoOutputs(trace=args.trace, chart=args.chart, schedule_chart=args.schedule_chart)
    try:
        device = device_from_option(args.device)
        for option, path, png in (("--trace", outputs.trace, False), ("--chart", outputs.chart, True),
                                  ("--schedule-chart", outputs.schedule_chart, True)):
            check_output_path(option, path, png)
    except ValueError as exc:
        print(f"swpipeline demo: error: {exc}", file=sys.stderr)
        return 2
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_demo(cfg, device, outputs)
    finally:
        torch.set_num_threads(previous_threads)


def device_from_option(text: Optional[str]) -> Device:
    """The Device for ``--device TEXT``; ValueError in command-line words if it cannot be used here."""
    if text is None:
        return resolve_device(None)
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise ValueError(f"--device {text}: not a device name; use cpu, or an accelerator such as cuda or "
                         f"cuda:1") from None
    if dev.type == "meta":
        raise ValueError(f"--device {text}: meta tensors hold no data, so nothing can be trained on them; use cpu, "
                         f"or an accelerator such as cuda")
    if dev.type != "cpu":
        accel = machine_accelerator()
        if accel is None or accel.type != dev.type:
            has = f"its accelerator is {accel.type}" if accel is not None else "it has no accelerator torch can use"
            raise ValueError(f"--device {text}: this machine has no {dev.type} device ({has}); use --device cpu, "
                             f"or leave --device out to use what the machine has")
        count = torch.accelerator.device_count()
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"--device {text}: this machine has {count} {dev.type} device(s), numbered from 0")
    return resolve_device(dev)


def run_demo(cfg: DemoConfig, device: Device, outputs: Optional[DemoOutputs] = None) -> int:
    """Print the plan, train serially and pipelined, print the comparison; returns the exit code.

    With ``outputs``, also write the pipelined run's trace and the pictures there (2: one could not be written).
    """
    print(f"swpipeline demo: DLRM-style click model ({cfg.num_sparse} embedding bags, {cfg.num_dense} dense "
          f"features), {cfg.iters} iterations x {cfg.batch_size} samples, on {device}")
    print(f"torch.set_num_threads(1): every torch op runs on one core, so the prep thread and the "
          f"training thread can run side by side ({os.cpu_count()} CPU cores here)\n")
    shown = TrainingJob(cfg, device)
    print(SCHEDULE_HEADING)
    shown.pipe.print_schedule(SCHEDULE_PERIODS)
    batches = [make_raw_batch(cfg, index) for index in range(cfg.iters)]
    megabytes = sum(raw_batch_bytes(batch) for batch in batches) / 2**20
    print(f"\nclick log generated up front ({cfg.iters} batches, {megabytes:.0f} MiB), so no timing includes it")
    print(f"training {cfg.warmup_iters} warm-up + {cfg.iters} timed iterations per mode, "
          f"each mode from the same initial weights ...\n", flush=True)
    serial = timed_run(cfg, device, batches, pipelined=False)
    pipelined = timed_run(cfg, device, batches, pipelined=True)
    print(format_results(serial, pipelined, cfg.iters))
    print(format_speedup_basis(serial, pipelined, cfg.iters))
    warning = format_interference([serial, pipelined])
    if warning is not None:
        print(warning)
    print()
    print(format_thread_split(shown.plan, serial, pipelined))
    equal, message = format_loss_check(serial, pipelined)
    print(message)
    written = True
    if pipelined.timeline is not None:
        print(f"\npipelined run, as traced:\n{pipelined.timeline.stats()}")
        if outputs is not None:
            written = write_outputs(outputs, pipelined.timeline, shown.pipe)
    return 2 if not written else 0 if equal else 1
