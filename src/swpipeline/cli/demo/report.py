"""The demo's printed report, in the order it is printed: the period schedule's heading, the results table and
what its speedup divides (and the busy-machine note), where each thread's time went, the loss check. Text only:
nothing here runs or writes."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ...plan.model import PipelinePlan
from .runs import RunResult

__all__: List[str] = []


SCHEDULE_PERIODS = 5  # the fill (stages 0 and 1 alone), then every stage at work
SCHEDULE_HEADING = (f"the plan, period by period (pipe.print_schedule({SCHEDULE_PERIODS}): a row per task, the last "
                    f"stage first, as each period runs them; iN: iteration N runs the task in that period):")


def format_results(serial: RunResult, pipelined: RunResult, iters: int) -> str:
    """The results table: time, ms/iter and speedup of both runs."""
    lines = [f"{'mode':<10} {'time (s)':>9} {'ms/iter':>9} {'speedup':>8}",
             f"{'-' * 10} {'-' * 9} {'-' * 9} {'-' * 8}"]
    for result in (serial, pipelined):
        speedup = serial.seconds / result.seconds
        lines.append(f"{result.mode:<10} {result.seconds:>9.3f} {result.seconds / iters * 1e3:>9.3f} "
                     f"{speedup:>7.2f}x")
    return "\n".join(lines)


def format_speedup_basis(serial: RunResult, pipelined: RunResult, iters: int) -> str:
    """The line under the results table: the two timings the speedup divides, and why they compare."""
    return (f"speedup = serial {serial.seconds:.3f} s / pipelined {pipelined.seconds:.3f} s: both runs train the "
            f"same {iters} batches from the same initial weights on this machine, one after the other")


def _per_group(plan: PipelinePlan, result: RunResult) -> Dict[str, float]:
    """Host seconds of a run's tasks, summed per thread group (in the plan's order)."""
    per_group: Dict[str, float] = {}
    for name, seconds in result.task_seconds.items():
        group = plan.schedules[name].thread_group
        per_group[group] = per_group.get(group, 0.0) + seconds
    return per_group


def format_thread_split(plan: PipelinePlan, serial: RunResult, pipelined: Optional[RunResult] = None) -> str:
    """Where the serial run spent its time, per thread group, and the speedup overlapping them allows.

    With ``pipelined``, also how much longer each group's tasks took when the groups ran side by
    side: what the machine's cores, caches and memory cost the overlap, which no engine can win back.
    """
    per_group = _per_group(plan, serial)
    parts = ", ".join(f"{group} {seconds:.2f} s" for group, seconds in per_group.items())
    bound = sum(per_group.values()) / max(max(per_group.values()), 1e-9)
    text = (f"serial run, host time in each thread's tasks: {parts}\n"
            f"ideal pipelined speedup (threads fully overlapped) = total / largest = {bound:.2f}x")
    if pipelined is None:
        return text
    side_by_side = _per_group(plan, pipelined)
    total = sum(per_group.values())
    parts = ", ".join(f"{group} {seconds:.2f} s ({seconds / per_group[group] - 1:+.0%})"
                      for group, seconds in side_by_side.items() if per_group.get(group, 0.0) > 0.01 * total)
    largest = max(side_by_side.values())
    return (f"{text}\n"
            f"pipelined run, host time in each thread's tasks: {parts}: side by side, the threads slow each "
            f"other down (shared cores and memory, and the GIL for the Python parts of their tasks)\n"
            f"speedup if the pipelined run took only its busiest thread's time = serial / largest = "
            f"{serial.seconds / max(largest, 1e-9):.2f}x "
            f"(measured: {serial.seconds / max(pipelined.seconds, 1e-9):.2f}x)")


def format_interference(results: Sequence[RunResult]) -> Optional[str]:
    """A note when other processes took more than 10% of a core during a timed run, else None."""
    busy = [r for r in results if r.others_cpu_seconds is not None and r.others_cpu_seconds > 0.1 * r.seconds]
    if not busy:
        return None
    parts = " and ".join(f"{r.others_cpu_seconds:.1f} CPU-s during the {r.mode} run" for r in busy)
    seconds = {r.mode: r.seconds for r in results}
    speedup = (f"the speedup ({seconds['serial'] / max(seconds['pipelined'], 1e-9):.2f}x)"
               if {"serial", "pipelined"} <= seconds.keys() else "the speedup")
    return (f"note: other processes used {parts}:\n"
            f"      the machine was busy, so {speedup} says little about pipelining: each run lost a different "
            f"share of the cores; run again when it is idle")


def format_loss_check(serial: RunResult, pipelined: RunResult) -> Tuple[bool, str]:
    """Whether the per-iteration losses of both runs are bitwise equal, and a line saying so."""
    expected, got = serial.losses, pipelined.losses
    if expected.shape != got.shape:
        return False, (f"losses equal: NO: the serial run recorded {expected.numel()} losses, "
                       f"the pipelined run {got.numel()}")
    if torch.equal(expected, got):
        return True, (f"losses equal: yes (all {expected.numel()} iterations bitwise equal; "
                      f"loss {float(expected[0]):.4f} at iteration 0 -> {float(expected[-1]):.4f} "
                      f"at iteration {expected.numel() - 1})")
    k = int((expected != got).nonzero()[0])
    return False, (f"losses equal: NO: first difference at iteration {k}: serial {float(expected[k])!r}, "
                   f"pipelined {float(got[k])!r}; the pipelined run did not train the same model")
