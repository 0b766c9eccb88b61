"""``swpipeline demo``: train a small click model serially and pipelined, and compare.

The job is a DLRM-style recommendation model (embedding bags for the sparse
features, a bottom MLP for the dense ones, a top MLP on their concatenation,
binary click label). Every training iteration is five tasks in three stages::

    stage 0  PrepareBatch    thread "prep"     stream "prep"     raw record -> model-ready tensors
    stage 1  CopyToDevice    thread "copy"     stream "copy"     .to(device, non_blocking=True)
    stage 2  Forward         thread "default"  stream default    loss of the batch
             Backward        thread "default"  stream default
             OptimizerStep   thread "default"  stream default

    period     P0   P1   P2   P3   P4
    stage 0    i0   i1   i2   i3   i4     PrepareBatch (overlaps the model work on another core)
    stage 1    --   i0   i1   i2   i3     CopyToDevice
    stage 2    --   --   i0   i1   i2     Forward/Backward/OptimizerStep

No inter-iteration dependency is declared for Forward/Backward/OptimizerStep:
they share one thread and one stream, which already run ``OptimizerStep(i-1)``
before ``Forward(i)``. The model therefore sees exactly the updates of the serial
loop, and the demo checks that the per-iteration losses of both runs are equal.

Guarantees the check relies on: batch ``k`` is generated from ``seed + k`` alone,
both runs start from the same initial weights, and every torch op runs with one
intra-op thread in both runs (``torch.set_num_threads(1)``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Protocol, Sequence, Tuple, cast

import torch
from torch import nn

from .charts import save_period_table
from .cli import int_at_least
from .clocked import SWPipeline
from .device import Device, TorchDevice, machine_accelerator, resolve_device
from .plan import IterContext, PipelinePlan, PipelineTask, TaskSchedule
from .tables import ScheduleRow, format_period_table
from .timeline import Timeline

__all__: List[str] = []

_MASK31 = 2**31 - 1  # raw ids and hash states are 31-bit, so hash products fit in an int64
_HASH_MULTIPLIER = 0x45D9F3B  # a well-mixing odd constant for 32-bit integer hashes


@dataclass(frozen=True)
class DemoConfig:
    """Sizes of the demo job.

    The defaults make PrepareBatch cost about as much as Forward + Backward + OptimizerStep
    on one core, so two cores can overlap them for close to a 2x speedup.
    """

    iters: int = 200
    batch_size: int = 2048
    warmup_iters: int = 10
    seed: int = 0
    num_dense: int = 13
    table_sizes: Tuple[int, ...] = (20_000, 10_000, 5_000, 20_000, 8_000, 2_000, 15_000, 4_000)
    max_events: int = 16  # raw events (ids) per sample and feature: 1..max_events
    distinct_ids: int = 4  # events of one sample and feature repeat these many distinct ids
    embedding_dim: int = 16
    bottom_mlp: Tuple[int, ...] = (64, 16)
    top_mlp: Tuple[int, ...] = (64,)
    learning_rate: float = 0.05

    @property
    def num_sparse(self) -> int:
        return len(self.table_sizes)


# -- synthetic click data ------------------------------------------------------------------


class RawBatch(NamedTuple):
    """One batch as it comes from the event log: raw ids and counts, not yet usable by the model.

    ``ids`` holds every event's raw id, feature-major then sample-major; ``lengths[f, s]``
    is how many of them belong to feature ``f`` of sample ``s``. A sample's events repeat
    a few distinct ids (a user clicks the same items again), so most ids are repeats.
    """

    dense: torch.Tensor  # float32 [B, num_dense], non-negative heavy-tailed counts
    ids: torch.Tensor  # int32 [sum(lengths)], raw 31-bit ids
    lengths: torch.Tensor  # int64 [num_sparse, B], 1..max_events
    labels: torch.Tensor  # float32 [B], 0 or 1


def make_raw_batch(cfg: DemoConfig, index: int) -> RawBatch:
    """Batch ``index`` of the synthetic click log; a function of ``cfg.seed + index`` only."""
    gen = torch.Generator().manual_seed(cfg.seed + index)
    num_bags = cfg.num_sparse * cfg.batch_size
    dense = torch.empty(cfg.batch_size, cfg.num_dense).exponential_(0.05, generator=gen).floor_()
    lengths = torch.randint(1, cfg.max_events + 1, (cfg.num_sparse, cfg.batch_size), generator=gen)
    popular = torch.randint(0, 1000, (num_bags, cfg.distinct_ids), generator=gen)  # seen in many samples
    rare = torch.randint(0, _MASK31, (num_bags, cfg.distinct_ids), generator=gen)
    candidates = torch.where(torch.rand(num_bags, cfg.distinct_ids, generator=gen) < 0.5, popular, rare)
    bag = torch.repeat_interleave(torch.arange(num_bags), lengths.flatten())
    ids = candidates[bag, torch.randint(0, cfg.distinct_ids, (bag.numel(),), generator=gen)].int()
    truth = torch.Generator().manual_seed(cfg.seed)  # the same "true" click model for every batch
    weights = torch.randn(cfg.num_dense, generator=truth)
    dense_score = torch.log1p(dense) @ weights / cfg.num_dense**0.5
    sparse_score = (candidates[: cfg.batch_size, 0] % 2).float() - 0.5  # feature 0's first candidate
    logits = dense_score - dense_score.mean() + sparse_score
    labels = torch.bernoulli(torch.sigmoid(logits), generator=gen)
    return RawBatch(dense, ids, lengths, labels)


def raw_batch_bytes(batch: RawBatch) -> int:
    """Memory held by one raw batch's tensors."""
    return sum(t.numel() * t.element_size() for t in batch)


# -- batch preparation (stage 0) and the copy (stage 1) -------------------------------------


class ModelBatch(NamedTuple):
    """A batch the model can consume: one (ids, offsets) pair per embedding bag."""

    dense: torch.Tensor  # float32 [B, num_dense], standardised log-counts
    ids: Tuple[torch.Tensor, ...]  # per feature: int64 rows of its table, no repeats within a sample
    offsets: Tuple[torch.Tensor, ...]  # per feature: int64 [B], where each sample's bag starts in ids
    labels: torch.Tensor  # float32 [B, 1]

    def to(self, device: torch.device) -> "ModelBatch":
        """The batch on ``device`` (a no-op returning the same tensors when it is already there)."""
        return ModelBatch(self.dense.to(device, non_blocking=True),
                          tuple(t.to(device, non_blocking=True) for t in self.ids),
                          tuple(t.to(device, non_blocking=True) for t in self.offsets),
                          self.labels.to(device, non_blocking=True))

    def tensors(self) -> List[torch.Tensor]:
        """Every tensor of the batch, as a flat list."""
        return [self.dense, *self.ids, *self.offsets, self.labels]


def hash_ids(ids: torch.Tensor, feature: torch.Tensor, table_sizes: Sequence[int]) -> torch.Tensor:
    """Row of each raw id in its feature's table: a feature-salted 31-bit integer hash, mod the table size."""
    salts = torch.tensor([(0x9E3779B1 * (f + 1)) & _MASK31 for f in range(len(table_sizes))])
    state = (ids.long() ^ salts[feature]) & _MASK31
    for _ in range(2):
        state = ((state >> 16) ^ state) * _HASH_MULTIPLIER & _MASK31
    state = (state >> 16) ^ state
    return state % torch.tensor(list(table_sizes))[feature]


def prepare_batch(raw: RawBatch, table_sizes: Sequence[int]) -> ModelBatch:
    """Hash raw ids into their tables, drop repeated ids within a bag, build offsets, standardise dense.

    The work is done for all features at once: each event gets the key
    ``bag * stride + row`` (``bag = feature * B + sample``), so one sorted ``unique``
    both removes the repeats and groups the rows by feature, then by sample.
    """
    num_sparse, size = raw.lengths.shape
    bag = torch.repeat_interleave(torch.arange(num_sparse * size), raw.lengths.flatten())
    rows = hash_ids(raw.ids, torch.div(bag, size, rounding_mode="floor"), table_sizes)
    stride = max(table_sizes)
    keys = torch.unique(bag * stride + rows)
    per_bag = torch.bincount(torch.div(keys, stride, rounding_mode="floor"), minlength=num_sparse * size)
    per_bag = per_bag.view(num_sparse, size)
    ids = (keys % stride).split(per_bag.sum(1).tolist())
    offsets = (per_bag.cumsum(1) - per_bag).unbind(0)
    log_dense = torch.log1p(raw.dense)
    dense = (log_dense - log_dense.mean(0)) / (log_dense.std(0) + 1e-6)
    return ModelBatch(dense, tuple(ids), tuple(offsets), raw.labels.unsqueeze(1))


# -- the model -----------------------------------------------------------------------------


def _mlp(in_features: int, widths: Sequence[int], relu_last: bool) -> nn.Sequential:
    """Linear layers of the given widths with ReLU between them (and after the last if asked)."""
    layers: List[nn.Module] = []
    for k, width in enumerate(widths):
        layers.append(nn.Linear(in_features, width))
        if relu_last or k < len(widths) - 1:
            layers.append(nn.ReLU())
        in_features = width
    return nn.Sequential(*layers)


class ClickModel(nn.Module):
    """DLRM-style: bottom MLP on dense features, one EmbeddingBag per sparse feature, top MLP -> logit."""

    def __init__(self, cfg: DemoConfig) -> None:
        super().__init__()
        self.embeddings = nn.ModuleList(nn.EmbeddingBag(rows, cfg.embedding_dim, mode="sum")
                                        for rows in cfg.table_sizes)
        self.bottom = _mlp(cfg.num_dense, cfg.bottom_mlp, relu_last=True)
        top_in = cfg.bottom_mlp[-1] + cfg.num_sparse * cfg.embedding_dim
        self.top = _mlp(top_in, (*cfg.top_mlp, 1), relu_last=False)

    def forward(self, batch: ModelBatch) -> torch.Tensor:
        pooled = [bag(ids, offsets) for bag, ids, offsets in zip(self.embeddings, batch.ids, batch.offsets)]
        logits: torch.Tensor = self.top(torch.cat([self.bottom(batch.dense), *pooled], dim=1))
        return logits


# -- the pipelined training job --------------------------------------------------------------


class TrainingContext(Protocol):
    """What the tasks read from and attach to the engine's IterContext.

    A view for the type checker only: IterContext types attached attributes as ``Any``,
    this names each one and its type.
    """

    batch: RawBatch
    iter_idx: int
    prepared: ModelBatch
    on_device: ModelBatch
    loss: torch.Tensor


TaskBody = Callable[[TrainingContext], None]


class TrainingJob:
    """A freshly initialised model and optimizer, the five task functions, and what they record.

    Two jobs built from one config start from bitwise identical weights.
    """

    def __init__(self, cfg: DemoConfig, device: Device) -> None:
        self.cfg = cfg
        self.torch_device = torch_device_of(device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.model = ClickModel(cfg).to(self.torch_device)
        self.optimizer = torch.optim.Adagrad(self.model.parameters(), lr=cfg.learning_rate)
        self.loss_fn = nn.BCEWithLogitsLoss()
        self.losses: List[torch.Tensor] = []  # one 0-dim tensor per iteration, in iteration order
        self.task_seconds: Dict[str, float] = {}  # host time spent in each task, summed over iterations
        self.plan = build_plan(self)
        self.pipe = SWPipeline(self.plan, device)

    def prepare_batch(self, ctx: TrainingContext) -> None:
        """PrepareBatch: raw record -> model-ready tensors (CPU work)."""
        ctx.prepared = prepare_batch(ctx.batch, self.cfg.table_sizes)

    def copy_to_device(self, ctx: TrainingContext) -> None:
        """CopyToDevice: the prepared batch on the training device."""
        ctx.on_device = ctx.prepared.to(self.torch_device)
        del ctx.prepared

    def forward(self, ctx: TrainingContext) -> None:
        """Forward: the batch's loss."""
        batch = ctx.on_device  # made on the copy stream: the engine keeps it alive for this one
        ctx.loss = self.loss_fn(self.model(batch), batch.labels)

    def backward(self, ctx: TrainingContext) -> None:
        """Backward: gradients of the batch's loss."""
        torch.autograd.backward(ctx.loss)

    def optimizer_step(self, ctx: TrainingContext) -> None:
        """OptimizerStep: update the weights, clear the gradients, record the loss."""
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.losses.append(ctx.loss.detach())
        del ctx.on_device

    def timed(self, name: str, body: TaskBody) -> Callable[[IterContext], None]:
        """``body`` as a task function that also adds its host time to ``task_seconds[name]``."""
        self.task_seconds[name] = 0.0

        def task_fn(ctx: IterContext) -> None:
            start = time.perf_counter()
            body(cast(TrainingContext, ctx))
            self.task_seconds[name] += time.perf_counter() - start

        return task_fn


def build_plan(job: TrainingJob) -> PipelinePlan:
    """The job's three-stage plan: prepare on thread/stream "prep", copy on "copy", train on the defaults."""
    prepare = PipelineTask("PrepareBatch", job.timed("PrepareBatch", job.prepare_batch))
    copy = PipelineTask("CopyToDevice", job.timed("CopyToDevice", job.copy_to_device))
    forward = PipelineTask("Forward", job.timed("Forward", job.forward))
    backward = PipelineTask("Backward", job.timed("Backward", job.backward))
    step = PipelineTask("OptimizerStep", job.timed("OptimizerStep", job.optimizer_step))
    return PipelinePlan(
        schedule={
            prepare: TaskSchedule(stage=0, stream="prep", thread_group="prep"),
            copy: TaskSchedule(stage=1, stream="copy", thread_group="copy"),
            forward: TaskSchedule(stage=2),
            backward: TaskSchedule(stage=2),
            step: TaskSchedule(stage=2),
        },
        intra_iter_deps=[(copy, prepare), (forward, copy), (backward, forward), (step, backward)],
        # No inter_iter_deps: Forward(i) follows OptimizerStep(i-1) on the same thread and stream.
    )


def torch_device_of(device: Device) -> torch.device:
    """The torch.device tensors must live on for ``device``."""
    return device.torch_device if isinstance(device, TorchDevice) else torch.device("cpu")


# -- running both modes and reporting --------------------------------------------------------


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


def format_results(serial: RunResult, pipelined: RunResult, iters: int) -> str:
    """The results table: time, ms/iter and speedup of both runs."""
    lines = [f"{'mode':<10} {'time (s)':>9} {'ms/iter':>9} {'speedup':>8}",
             f"{'-' * 10} {'-' * 9} {'-' * 9} {'-' * 8}"]
    for result in (serial, pipelined):
        speedup = serial.seconds / result.seconds
        lines.append(f"{result.mode:<10} {result.seconds:>9.3f} {result.seconds / iters * 1e3:>9.3f} "
                     f"{speedup:>7.2f}x")
    return "\n".join(lines)


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
            f"{serial.seconds / max(largest, 1e-9):.2f}x (measured: {serial.seconds / max(pipelined.seconds, 1e-9):.2f}x)")


def format_interference(results: Sequence[RunResult]) -> Optional[str]:
    """A warning when other processes took more than 10% of a core during a timed run, else None."""
    busy = [r for r in results if r.others_cpu_seconds is not None and r.others_cpu_seconds > 0.1 * r.seconds]
    if not busy:
        return None
    parts = " and ".join(f"{r.others_cpu_seconds:.1f} CPU-s during the {r.mode} run" for r in busy)
    return (f"note: other processes used {parts}:\n"
            f"      the machine was busy, so these timings are not representative; run again when it is idle")


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


# -- command line ----------------------------------------------------------------------------


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


@dataclass(frozen=True)
class DemoOutputs:
    """Where ``swpipeline demo`` writes its pictures and trace ('' or None: not written)."""

    trace: Optional[str] = "out/demo_trace.json"
    chart: Optional[str] = "out/demo_timeline.png"
    schedule_chart: Optional[str] = "out/demo_schedule.png"
    chart_iterations: int = 8  # the chart shows the first iterations: the fill, then the steady state


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    """The DemoConfig for parsed ``swpipeline demo`` arguments."""
    return replace(DemoConfig(), iters=args.iters, batch_size=args.batch_size,
                   warmup_iters=args.warmup_iters, seed=args.seed)


def run(args: argparse.Namespace) -> int:
    """Run the demo for parsed arguments; returns 0 when both runs' losses are equal, else 1 (2: bad device)."""
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


def check_output_path(option: str, path: Optional[str], png: bool = False) -> None:
    """Refuse an output path that could not be written, before any training: ValueError naming the option.

    The path must name a file (a ``.png`` one for a picture) whose folder exists or can be made, and the
    file system must let it be created there (tried: a name too long, a read-only or special file
    system such as ``/proc`` is refused now, not after the training).
    """
    if not path:
        return
    skip = "(or '' to skip this output)"
    if path.endswith(("/", os.sep)):
        raise ValueError(f"{option} {path}: ends with '/', so it names a folder; give a file name in it, such as "
                         f"{path}{'timeline.png' if png else 'trace.json'} {skip}")
    target = Path(path)
    longest = max(target.parts, key=lambda part: len(os.fsencode(part)))
    existing = target.parent
    while not _exists(existing) and existing != existing.parent:
        existing = existing.parent
    limit = _name_max(existing)
    if len(os.fsencode(longest)) > limit:
        raise ValueError(f"{option} {path[:40]}...: a name in it is {len(os.fsencode(longest))} bytes long, and "
                         f"this file system allows at most {limit}; choose a shorter name {skip}")
    try:
        if target.is_dir():
            raise ValueError(f"{option} {path}: is a directory; give a file name {skip}")
        if png and target.suffix.lower() != ".png":
            raise ValueError(f"{option} {path}: the picture is a PNG; give a file name ending in .png {skip}")
        if not existing.is_dir():
            raise ValueError(f"{option} {path}: {existing} is a file, so no directory can be made there; choose "
                             f"another path {skip}")
        if not os.access(existing, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
            raise ValueError(f"{option} {path}: not writable; choose another path {skip}")
        _try_creating(target, existing)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ValueError(f"{option} {path}: no file can be created there ({reason}); choose another path "
                         f"{skip}") from None


def _exists(path: Path) -> bool:
    """Whether ``path`` exists (False for a path the system cannot even look up, e.g. a name too long)."""
    try:
        return path.exists()
    except OSError:
        return False


def _name_max(folder: Path) -> int:
    """The longest file name (bytes) the file system holding ``folder`` allows (255 where it cannot say)."""
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return 255


def _try_creating(target: Path, existing: Path) -> None:
    """Create (then remove) the file, or a scratch file in the nearest existing folder: OSError if impossible."""
    if target.parent != existing:
        with tempfile.TemporaryFile(dir=existing):
            return
    if target.exists():
        with open(target, "ab"):  # appends nothing: the file is left as it is
            return
    try:
        handle = open(target, "xb")
    except FileExistsError:  # made meanwhile by someone else: theirs to keep
        return
    handle.close()
    target.unlink()


def run_demo(cfg: DemoConfig, device: Device, outputs: Optional[DemoOutputs] = None) -> int:
    """Print the plan, train serially and pipelined, print the comparison; returns the exit code.

    With ``outputs``, also write the pipelined run's trace and the pictures there (2: one could not be written).
    """
    print(f"swpipeline demo: DLRM-style click model ({cfg.num_sparse} embedding bags, {cfg.num_dense} dense "
          f"features), {cfg.iters} iterations x {cfg.batch_size} samples, on {device}")
    print(f"torch.set_num_threads(1): every torch op runs on one core, so the prep thread and the "
          f"training thread can run side by side ({os.cpu_count()} CPU cores here)\n")
    shown = TrainingJob(cfg, device)
    print("the plan, period by period (a row per task, in the order a batch goes through them; iN: iteration N "
          "runs the task in that period):")
    print(format_period_table(schedule_rows(shown.pipe, SCHEDULE_PERIODS), SCHEDULE_PERIODS))
    batches = [make_raw_batch(cfg, index) for index in range(cfg.iters)]
    megabytes = sum(raw_batch_bytes(batch) for batch in batches) / 2**20
    print(f"\nclick log generated up front ({cfg.iters} batches, {megabytes:.0f} MiB), so no timing includes it")
    print(f"training {cfg.warmup_iters} warm-up + {cfg.iters} timed iterations per mode, "
          f"each mode from the same initial weights ...\n", flush=True)
    serial = timed_run(cfg, device, batches, pipelined=False)
    pipelined = timed_run(cfg, device, batches, pipelined=True)
    print(format_results(serial, pipelined, cfg.iters))
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


SCHEDULE_PERIODS = 5  # the fill (stages 0 and 1 alone), then every stage at work


def schedule_rows(pipe: SWPipeline, num_periods: int) -> List[ScheduleRow]:
    """The period schedule's rows in the order a batch goes through them: by stage, then as each period submits
    them (``print_schedule`` lists the oldest iteration's work first, so the last stage comes first)."""
    plan = pipe.plan
    position = {name: k for k, name in enumerate(pipe.enqueue_order)}
    rows: List[ScheduleRow] = []
    for name in sorted(plan.task_names, key=lambda n: (plan.stage(n), position[n])):
        schedule, stage = plan.schedules[name], plan.stage(name)
        cells = [f"i{p - stage}" if p >= stage else "--" for p in range(num_periods)]
        rows.append((name, schedule.thread_group, "default" if schedule.stream is None else str(schedule.stream),
                     cells))
    return rows


def write_outputs(outputs: DemoOutputs, timeline: Timeline, pipe: SWPipeline) -> bool:
    """Write the trace JSON and the pictures that ``outputs`` asks for, and say where they are (or why not);
    returns whether every asked-for file was written."""
    lines, failed = [], []
    for option, path in (("--trace", outputs.trace), ("--chart", outputs.chart),
                         ("--schedule-chart", outputs.schedule_chart)):
        if not path:
            continue
        try:
            lines.append(_write_output(option, path, outputs, timeline, pipe))
        except ImportError as exc:
            lines.append(f"pictures skipped: {exc}")
            break
        except OSError as exc:
            failed.append(f"swpipeline demo: error: {option} {path}: could not be written "
                          f"({exc.strerror or exc}); the results above stand")
    if lines:
        print("\n" + "\n".join(lines))
    for line in failed:
        print(line, file=sys.stderr)
    return not failed


def _write_output(option: str, path: str, outputs: DemoOutputs, timeline: Timeline, pipe: SWPipeline) -> str:
    """Write one output; the line saying where it is."""
    if option == "--trace":
        timeline.save_chrome_trace(path)
        return f"trace: {path} (open it at https://ui.perfetto.dev or chrome://tracing)"
    if option == "--chart":
        last = min(outputs.chart_iterations, timeline.num_iterations) - 1
        timeline.save_chart(path, iterations=(0, last),
                            title=f"swpipeline demo, pipelined: iterations 0-{last} of {timeline.num_iterations} "
                                  f"on {timeline.device}")
        return f"timeline chart: {path}"
    save_period_table(schedule_rows(pipe, SCHEDULE_PERIODS), path,
                      title=f"swpipeline demo: schedule of depth {pipe.depth}, {SCHEDULE_PERIODS} periods")
    return f"schedule picture: {path}"
