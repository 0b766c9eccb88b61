"""Jitter tolerance: clock-driven SWPipeline vs data-flow DataFlowPipeline under a heavy-tailed copy stage.

What is measured
    A 3-stage chain, each task on its own thread group and stream, every body a
    ``time.sleep`` (it releases the GIL; the reference machine has 2 cores)::

        stage 0  Copy       usually 1 ms; with probability 0.15 uniform 5-10 ms (the jitter)
        stage 1  InputDist  uniform 1-2 ms
        stage 2  Compute    4 ms, the bottleneck T_b

    with ``InputDist`` after ``Copy`` and ``Compute`` after ``InputDist`` in each
    iteration. The per-iteration costs are drawn once from ``random.Random(seed)``
    and passed in as the batches, so every engine and every repeat sees the same
    jitter sequence. The jitter-free control sequence is Copy 1, InputDist 1.5,
    Compute 4 ms for every iteration.

    Each repeat runs, interleaved: ``run_serial``, ``SWPipeline`` (depth 3),
    ``DataFlowPipeline`` for each ``max_depth`` in 2..6, and the jitter-free
    control for ``SWPipeline`` and ``DataFlowPipeline(max_depth=3)``. A pipelined run is
    ``fill_pipeline`` followed by ``progress`` until ``StopIteration`` and ``drain``
    (what ``run`` does), timed from the ``fill_pipeline`` call.

How to read the table (medians over repeats)
    * ``it/s``: iterations / wall time of the whole run (thread start, fill and drain included).
    * ``% ideal``: ``it/s * T_b`` with ``T_b`` the measured Compute body time (the
      median over all pipelined runs; ``sleep(4 ms)`` overshoots a little): the share of
      the jitter-free ideal ``1 / T_b`` that the run kept.
    * ``model %``: the same share predicted from the nominal costs by the queue model
      below, with no engine overhead (serial: the sum of all costs).
    * ``fill ms``: time from calling ``fill_pipeline`` to the first ``progress()``
      returning, i.e. until iteration 0 retires.
    * ``peak ctx``: ``pipe.peak_live_contexts`` after the run: the most iterations
      (IterContexts, i.e. batch buffers) alive at once. ``run_serial`` holds one.

Queue model
    Each task has one FIFO worker, so with ``end(s, j)`` the time stage ``s`` finishes
    iteration ``j`` and ``retire(j) = end(2, j)``::

        start(s, j) = max(end(s-1, j), end(s, j-1), retire(j - gate(s)))

    SWPipeline enqueues stage ``s`` of iteration ``j`` in period ``j + s``, once
    iteration ``j + s - depth`` has retired: ``gate(s) = depth - s``. DataFlowPipeline
    creates iteration ``j``'s context once ``j - max_depth`` has retired:
    ``gate(s) = max_depth``. So a copy may start up to ``depth`` (or ``max_depth``)
    iterations ahead of its retirement in both engines: with depth 3 the Copy of
    iteration ``j`` has about ``2 * T_b`` before Compute wants it, and a 5-10 ms copy
    plus its InputDist only stalls Compute by what exceeds that. The interpretation
    also quotes a *lock-step* clock (each period lasts as long as its slowest stage),
    which the engine is not: progress() waits for the oldest iteration only.
"""

from __future__ import annotations

import argparse
import random
import statistics
import textwrap
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import swpipeline as swp
from _common import format_table, machine_line

COMPUTE_MS = 4.0
COPY_MS = 1.0
JITTER_MS = (5.0, 10.0)
DIST_MS = (1.0, 2.0)
DEFAULT_JITTER_PROB = 0.15
SWP_DEPTH = 3
MAX_DEPTHS = (2, 3, 4, 5, 6)
CONTROL_MAX_DEPTH = 3
TARGET = 0.95

Costs = Tuple[float, float, float]  # seconds of Copy, InputDist, Compute for one iteration
Pipeline = Union[swp.SWPipeline, swp.DataFlowPipeline]


def jittered_costs(iters: int, seed: int, jitter_prob: float) -> List[Costs]:
    """Per-iteration stage costs with a heavy-tailed copy, drawn from ``random.Random(seed)``."""
    rng = random.Random(seed)
    costs = []
    for _ in range(iters):
        copy_ms = rng.uniform(*JITTER_MS) if rng.random() < jitter_prob else COPY_MS
        costs.append((copy_ms / 1e3, rng.uniform(*DIST_MS) / 1e3, COMPUTE_MS / 1e3))
    return costs


def steady_costs(iters: int) -> List[Costs]:
    """The jitter-free control: every stage at its typical cost."""
    return [(COPY_MS / 1e3, statistics.fmean(DIST_MS) / 1e3, COMPUTE_MS / 1e3)] * iters


@dataclass
class ComputeClock:
    """Durations of the Compute body (the bottleneck), as measured inside the task."""

    durations: List[float] = field(default_factory=list)


def sleep_stage(k: int) -> Callable[[swp.IterContext], None]:
    """A task body sleeping for stage ``k``'s cost, taken from the batch."""

    def body(ctx: swp.IterContext) -> None:
        time.sleep(ctx.batch[k])

    return body


def compute_stage(clock: ComputeClock) -> Callable[[swp.IterContext], None]:
    """The bottleneck body: sleep for its cost and record how long that took."""

    def body(ctx: swp.IterContext) -> None:
        start = time.perf_counter()
        time.sleep(ctx.batch[2])
        clock.durations.append(time.perf_counter() - start)

    return body


def build_plan(clock: ComputeClock) -> swp.PipelinePlan:
    """Copy (stage 0) -> InputDist (stage 1) -> Compute (stage 2), each on its own group and stream."""
    layout = [("Copy", sleep_stage(0), "copy", "memcpy"), ("InputDist", sleep_stage(1), "dist", "data_dist"),
              ("Compute", compute_stage(clock), "compute", "compute")]
    schedule: Dict[Union[swp.PipelineTask, str], swp.TaskSchedule] = {
        swp.PipelineTask(name, fn): swp.TaskSchedule(stage=k, stream=stream, thread_group=group)
        for k, (name, fn, group, stream) in enumerate(layout)
    }
    return swp.PipelinePlan(schedule, intra_iter_deps=[("InputDist", "Copy"), ("Compute", "InputDist")])


@dataclass(frozen=True)
class Config:
    """One table row: the engine (SWPipeline if ``max_depth`` is None; ``serial``: its run_serial) and the costs."""

    label: str
    costs: str  # "jitter" or "none"
    max_depth: Optional[int]  # DataFlowPipeline's max_depth; None for SWPipeline and serial
    serial: bool = False

    def gates(self) -> List[int]:
        """The queue model's ``gate(s)`` per stage (see the module docstring)."""
        if self.max_depth is not None:
            return [self.max_depth] * 3
        return [SWP_DEPTH - s for s in range(3)]


def configs() -> List[Config]:
    """The rows, in table order: serial, SWPipeline, DataFlow per max_depth, then the jitter-free control."""
    rows = [Config("serial (run_serial)", "jitter", None, serial=True), Config("SWPipeline", "jitter", None)]
    rows += [Config(f"DataFlow max_depth={k}", "jitter", k) for k in MAX_DEPTHS]
    rows += [Config("SWPipeline", "none", None), Config(f"DataFlow max_depth={CONTROL_MAX_DEPTH}", "none",
                                                        CONTROL_MAX_DEPTH)]
    return rows


def make_pipeline(config: Config, plan: swp.PipelinePlan, device: str) -> Pipeline:
    """The engine a row runs on."""
    if config.max_depth is None:
        return swp.SWPipeline(plan, device=device)
    return swp.DataFlowPipeline(plan, max_depth=config.max_depth, device=device)


@dataclass(frozen=True)
class RunResult:
    """One timed run; times in seconds (fill latency None for serial runs)."""

    total: float
    fill_latency: Optional[float]
    peak_contexts: int


def timed_run(pipe: Pipeline, batches: Sequence[Costs], serial: bool) -> RunResult:
    """``run_serial``, or fill_pipeline + progress until StopIteration + drain, timed from the fill."""
    if serial:
        return RunResult(pipe.run_serial(batches), None, 1)
    start = time.perf_counter()
    first: Optional[float] = None
    try:
        it = pipe.fill_pipeline(batches)
        while True:
            try:
                pipe.progress(it)
            except StopIteration:
                break
            if first is None:
                first = time.perf_counter()
    finally:
        pipe.drain()
    total = time.perf_counter() - start
    return RunResult(total, None if first is None else first - start, pipe.peak_live_contexts)


def model_seconds(costs: Sequence[Costs], config: Config) -> float:
    """Predicted wall time from the queue model (serial: the sum of all costs)."""
    if config.serial:
        return sum(sum(c) for c in costs)
    gates = config.gates()
    ends = [[0.0] * len(costs) for _ in range(3)]
    for j, stage_costs in enumerate(costs):
        for s, cost in enumerate(stage_costs):
            gate = ends[2][j - gates[s]] if j >= gates[s] else 0.0
            ready = max(ends[s - 1][j] if s else 0.0, ends[s][j - 1] if j else 0.0, gate)
            ends[s][j] = ready + cost
    return ends[2][-1]


def lockstep_seconds(costs: Sequence[Costs]) -> float:
    """A lock-step clock of depth 3: each period lasts as long as its slowest stage."""
    n = len(costs)
    return sum(max(costs[p - s][s] for s in range(3) if 0 <= p - s < n) for p in range(n + 2))


@dataclass
class RowSummary:
    """Medians over repeats for one configuration (seconds, fractions)."""

    config: Config
    throughput: float
    fill_latency: Optional[float]
    peak_contexts: int
    model_share: float
    share: float = 0.0  # of 1 / T_b, filled once T_b is known


def summarize(config: Config, results: List[RunResult], costs: Sequence[Costs]) -> RowSummary:
    iters = len(costs)
    throughput = statistics.median(iters / r.total for r in results)
    fills = [r.fill_latency for r in results if r.fill_latency is not None]
    fill = statistics.median(fills) if fills else None
    model_share = iters * COMPUTE_MS / 1e3 / model_seconds(costs, config)
    return RowSummary(config, throughput, fill, max(r.peak_contexts for r in results), model_share)


def measure(iters: int, repeats: int, seed: int, jitter_prob: float,
            device: str) -> Tuple[List[RowSummary], float, Dict[str, List[Costs]]]:
    """Run every configuration ``repeats`` times, interleaved; returns the rows, T_b and the cost sequences."""
    clock = ComputeClock()
    plan = build_plan(clock)
    sequences = {"jitter": jittered_costs(iters, seed, jitter_prob), "none": steady_costs(iters)}
    rows = configs()
    pipes = [make_pipeline(c, plan, device) for c in rows]
    for config, pipe in zip(rows, pipes):
        timed_run(pipe, steady_costs(10), config.serial)  # warm-up
    clock.durations.clear()
    results: List[List[RunResult]] = [[] for _ in rows]
    for _ in range(repeats):
        for k, (config, pipe) in enumerate(zip(rows, pipes)):
            mark = len(clock.durations)
            results[k].append(timed_run(pipe, sequences[config.costs], config.serial))
            if config.serial:
                del clock.durations[mark:]  # T_b is the in-pipeline cost
    t_bottleneck = statistics.median(clock.durations)
    summaries = [summarize(c, r, sequences[c.costs]) for c, r in zip(rows, results)]
    for s in summaries:
        s.share = s.throughput * t_bottleneck
    return summaries, t_bottleneck, sequences


def table_row(s: RowSummary) -> List[str]:
    """One row of the printed table."""
    depth = "-" if s.config.serial else str(s.config.max_depth or SWP_DEPTH)
    fill = "-" if s.fill_latency is None else f"{s.fill_latency * 1e3:.1f}"
    return [s.config.label, s.config.costs, depth, f"{s.throughput:.1f}", f"{s.share:.1%}", f"{s.model_share:.1%}",
            fill, str(s.peak_contexts)]


def find(rows: Sequence[RowSummary], label_start: str, costs: str, max_depth: Optional[int] = None) -> RowSummary:
    """The row with this label prefix, cost sequence and max_depth."""
    return next(r for r in rows if r.config.label.startswith(label_start) and r.config.costs == costs
                and r.config.max_depth == max_depth)


def interpretation(rows: Sequence[RowSummary], sequences: Dict[str, List[Costs]]) -> List[str]:
    """Three lines computed from the measured rows: control, jitter, fill."""
    sw_ctl, df_ctl = find(rows, "SWPipeline", "none"), find(rows, "DataFlow", "none", CONTROL_MAX_DEPTH)
    gap = abs(sw_ctl.share - df_ctl.share) * 100
    lines = [f"- no jitter: SWPipeline {sw_ctl.share:.1%} vs DataFlow(max_depth={CONTROL_MAX_DEPTH}) "
             f"{df_ctl.share:.1%} of 1/T_b: the engines {'match' if gap < 2 else 'differ'} ({gap:.1f} points)."]
    costs = sequences["jitter"]
    sw = find(rows, "SWPipeline", "jitter")
    flows = [r for r in rows if r.config.costs == "jitter" and r.config.max_depth is not None]
    good = [r for r in flows if r.share >= TARGET]
    lockstep = len(costs) * COMPUTE_MS / 1e3 / lockstep_seconds(costs)
    why = (f", less than the engine: its FIFO workers let a copy start up to {SWP_DEPTH} iterations ahead"
           if lockstep < sw.model_share - 0.005 else "")
    text = (f"- jitter: SWPipeline keeps {sw.share:.1%} (model {sw.model_share:.1%}; a lock-step clock would keep "
            f"{lockstep:.1%}{why}). ")
    if good:
        depths = ", ".join(str(r.config.max_depth) for r in good)
        text += (f"DataFlow keeps >= {TARGET:.0%} at max_depth {depths} (max_depth={good[0].config.max_depth}: "
                 f"{good[0].share:.1%}, {good[0].peak_contexts} live contexts vs {sw.peak_contexts}); ")
    else:
        text += f"no DataFlow max_depth reaches {TARGET:.0%}; "
    same = find(rows, "DataFlow", "jitter", SWP_DEPTH)
    holds = bool(good) and sw.share < TARGET
    text += (f"at max_depth={SWP_DEPTH} (SWPipeline's window and memory) it keeps {same.share:.1%}. Claim "
             f"(DataFlow >= {TARGET:.0%}, SWPipeline below it): {'holds' if holds else 'does not hold'} here.")
    lines.append(text)
    fills = [r.fill_latency * 1e3 for r in rows if r.config.costs == "jitter" and r.fill_latency is not None]
    lines.append(f"- fill: the first progress() returns after {min(fills):.1f}-{max(fills):.1f} ms in every engine, "
                 f"~ iteration 0's stage costs ({sum(costs[0]) * 1e3:.1f} ms): the first retire waits for "
                 f"iteration 0 to pass all stages, so this latency does not separate the engines.")
    return lines


def print_report(rows: Sequence[RowSummary], t_bottleneck: float, sequences: Dict[str, List[Costs]],
                 args: argparse.Namespace) -> None:
    jitter = sequences["jitter"]
    spikes = sum(1 for c in jitter if c[0] > COPY_MS / 1e3)
    mean_copy = statistics.fmean(c[0] for c in jitter) * 1e3
    print(f"Jitter tolerance: Copy -> InputDist -> Compute (sleep), {args.iters} iterations, "
          f"median of {args.repeats} repeats, seed {args.seed}")
    print(machine_line())
    print(f"jitter: Copy {COPY_MS:g} ms, or {JITTER_MS[0]:g}-{JITTER_MS[1]:g} ms with p={args.jitter_prob:g} "
          f"({spikes} of {len(jitter)} iterations, mean copy {mean_copy:.2f} ms); InputDist "
          f"{DIST_MS[0]:g}-{DIST_MS[1]:g} ms; Compute {COMPUTE_MS:g} ms, measured T_b = {t_bottleneck * 1e3:.3f} ms "
          f"(ideal {1 / t_bottleneck:.1f} it/s)")
    print()
    headers = ["engine", "jitter", "depth", "it/s", "% ideal", "model %", "fill ms", "peak ctx"]
    print(format_table(headers, [table_row(r) for r in rows], left=2))
    print()
    for line in interpretation(rows, sequences):
        print(textwrap.fill(line, width=118, subsequent_indent="  "))


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--iters", type=int, default=300, help="iterations per run (default 300)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of every configuration (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the jitter sequence (default 0)")
    parser.add_argument("--jitter-prob", type=float, default=DEFAULT_JITTER_PROB,
                        help=f"probability of a slow copy (default {DEFAULT_JITTER_PROB})")
    parser.add_argument("--quick", action="store_true", help="smoke run: 60 iterations, 1 repeat")
    parser.add_argument("--device", default="cpu", help="engine device (default cpu)")
    args = parser.parse_args(argv)
    if args.quick:
        args.iters, args.repeats = 60, 1
    if args.iters <= max(MAX_DEPTHS) or args.repeats < 1 or not 0.0 <= args.jitter_prob <= 1.0:
        parser.error(f"--iters must be > {max(MAX_DEPTHS)}, --repeats >= 1 and --jitter-prob in [0, 1], "
                     f"got {args.iters}, {args.repeats} and {args.jitter_prob}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    rows, t_bottleneck, sequences = measure(args.iters, args.repeats, args.seed, args.jitter_prob, args.device)
    print_report(rows, t_bottleneck, sequences, args)


if __name__ == "__main__":
    main()
