"""The pipelined training job: model, optimizer, the five task functions and the three-stage plan.

Every training iteration is five tasks in three stages::

    stage 0  PrepareBatch    thread "prep"     stream "prep"     raw record -> model-ready tensors
    stage 1  CopyToDevice    thread "copy"     stream "copy"     .to(device, non_blocking=True)
    stage 2  Forward         thread "default"  stream default    loss of the batch
             Backward        thread "default"  stream default
             OptimizerStep   thread "default"  stream default

No inter-iteration dependency is declared for Forward/Backward/OptimizerStep: they
share one thread and one stream, which already run ``OptimizerStep(i-1)`` before
``Forward(i)``, so the model sees exactly the updates of the serial loop.
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List, Protocol, cast

import torch
from torch import nn

from ...engine.clocked import SWPipeline
from ...devices.device import Device, TorchDevice
from ...plan.context import IterContext
from ...plan.model import PipelinePlan, PipelineTask, TaskSchedule
from .config import DemoConfig
from .data import RawBatch
from .model import ClickModel
from .prepare import ModelBatch, prepare_batch

__all__: List[str] = []


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
