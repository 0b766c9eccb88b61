"""Timing one run of the demo job, serial or pipelined, and what the run leaves (``RunResult``).

Both modes are timed alike, each on a fresh job from the same initial weights after a
warm-up on a throwaway one; the CPU time other processes took meanwhile is measured too,
so the report can say when the machine was too busy for the timings to mean much.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch

from ...devices.device import Device
from ...observe.timeline import Timeline
from .config import DemoConfig
from .data import RawBatch
from .job import TrainingJob

__all__: List[str] = []


@dataclass
class RunResult:
    """One timed run: its mode, wall-clock seconds, per-iteration losses and per-task host time."""

    mode: str
    seconds: float
    losses: torch.Tensor  # [iters], on the CPU
    task_seconds: Dict[str, float]  # host time per task, summed over the timed iterations
    others_cpu_seconds: Optional[float] = None  # CPU time other processes took meanwhile (Linux only)
    timeline: Optional[Timeline] = None  # what ran where and when (pipelined runs are traced)


def busy_cpu_seconds() -> Optional[float]:
    """CPU seconds the machine has spent busy since boot (Linux ``/proc/stat``), or None where unknown.

    Steal time counts as busy: it is time the hypervisor gave to someone else.
    """
    try:
        with open("/proc/stat") as stat:
            ticks = [int(value) for value in stat.readline().split()[1:9]]
        per_second = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None
    idle, iowait = ticks[3], ticks[4]
    return (sum(ticks) - idle - iowait) / per_second


def timed_run(cfg: DemoConfig, device: Device, batches: Sequence[RawBatch], pipelined: bool) -> RunResult:
    """Warm up on a throwaway job, then train a fresh job on ``batches`` and time it.

    Both modes are timed alike: by the engine, from the first batch to the device being idle.
    """
    mode = "pipelined" if pipelined else "serial"
    warmup_job = TrainingJob(cfg, device)
    _train(warmup_job, batches[: cfg.warmup_iters], pipelined)
    job = TrainingJob(cfg, device)
    busy_before, own_before = busy_cpu_seconds(), time.process_time()
    seconds = _train(job, batches, pipelined)
    busy_after, own_after = busy_cpu_seconds(), time.process_time()
    others = None
    if busy_before is not None and busy_after is not None:
        others = max(0.0, (busy_after - busy_before) - (own_after - own_before))
    return RunResult(mode, seconds, torch.stack(job.losses).cpu(), dict(job.task_seconds), others,
                     job.pipe.timeline)


def _train(job: TrainingJob, batches: Sequence[RawBatch], pipelined: bool) -> float:
    """Run ``batches`` through ``job``'s pipeline (pipelined runs traced); returns wall-clock seconds."""
    return job.pipe.run(batches, trace=True) if pipelined else job.pipe.run_serial(batches)
