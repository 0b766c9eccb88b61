"""StagedTrainPipeline: TorchRec's user-declared stages as a plan, one task per stage.

Stage k of TorchRec's ``PipelineStage`` list becomes task ``stage.name`` at
stage k on the stage's stream, depending on stage k-1 within the iteration;
``progress()`` returns the last stage's output for the oldest batch, which the
caller feeds to its own forward/backward/optimizer, and ``None`` once the data
is exhausted (TorchRec's convention for this class)::

    3 stages      P0   P1   P2   P3   P4  ...
    gpu_postproc  --   --   i0   i1   i2
    data_dist     --   i0   i1   i2   i3
    data_copy     i0   i1   i2   i3   i4
                                 ^ progress() #0 returns i0's output once P3 has run

Where the stages run (``lockstep``):

* ``True`` (the default), as TorchRec: every stage runs on the thread that calls
  ``progress()``, and call k runs the period that finishes batch k+1 (and starts
  batch k+depth) before it returns batch k. So whatever the caller does with
  batch k (its forward, backward, optimizer step) comes after the stages of the
  later batches and before the next call, in the same order on every rank. That
  is what TorchRec's ``SparseDataDistUtil`` stage needs: its input dist issues
  collectives, and its forward hook on the model waits for the next batch's input
  dist and advances its contexts, so ``start_sparse_data_dist`` of batch k+1 must
  run before the forward of batch k, on every rank in the same place.
* ``False``: the stages run on a worker thread, and the period that starts batch
  k+depth runs while the caller works on batch k. Only for stages that issue no
  collectives and share nothing with the caller's step; a stage of a
  ``SparseDataDistUtil`` is refused (``ValueError``).

``fill_callback`` runs after each stage while the pipeline fills;
``data_exhausted_callback`` runs once per stage when the data ends (TorchRec calls
it at every step after that); ``set_flush(True)`` stops drawing batches, and once
the batches in flight are out ``on_flush_end`` is called and the pipeline refills.
A new iterator after the end of the data refills the pipeline too (TorchRec's
class returns ``None`` for it first, see docs/torchrec.md).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, List, Optional, Sequence

import torch

from ..plan.context import IterContext
from ..plan.model import PipelinePlan, PipelineTask, TaskSchedule
from .pipeline import PlannedTrainPipeline

__all__: List[str] = []


class _StageTask:
    """Runs one PipelineStage on its iteration: stage 0 reads ``ctx.batch``, the others ``ctx.staged``."""

    def __init__(self, index: int, stage: Any, num_stages: int, on_accelerator: bool) -> None:
        self.index = index
        self.stage = stage
        self.num_stages = num_stages
        self.on_accelerator = on_accelerator

    def __call__(self, ctx: IterContext) -> None:
        inputs = ctx.batch if self.index == 0 else ctx.staged
        if self.on_accelerator and self.index > 0:
            inputs.record_stream(torch.get_device_module(self.stage.stream.device).current_stream())
        ctx.staged = self.stage.runnable(inputs)
        if self.stage.fill_callback is not None and ctx.iter_idx + self.index < self.num_stages:
            self.stage.fill_callback()  # this (iteration, stage) pair runs while the pipeline fills


class StagedPipeline(PlannedTrainPipeline):
    """TorchRec's StagedTrainPipeline calling convention on top of PlannedTrainPipeline (see the module docstring)."""

    def __init__(self, plan: PipelinePlan, device: torch.device, stages: Sequence[Any],
                 compute_stream: Optional[Any], on_flush_end: Optional[Callable[[], None]], **swp: Any) -> None:
        super().__init__(plan, None, device, output_of=self._final_output, **swp)
        self.stages = list(stages)
        self.compute_stream = compute_stream
        self.on_flush_end = on_flush_end
        self._flushing = False
        self._held: Optional[IterContext] = None  # lockstep: the next batch to return, its stages all run
        if not self.lockstep:
            tied = [stage.name for stage in self.stages if _uses_sparse_data_dist(stage)]
            if tied:
                raise ValueError(
                    f"lockstep=False: stage(s) {tied} run a SparseDataDistUtil, whose input dist issues collectives "
                    f"and shares its contexts with the model's forward (a forward hook), so it must run on the thread "
                    f"that calls progress(), in step with the forward; use lockstep=True (the default)")

    def _final_output(self, ctx: IterContext) -> Any:
        out = ctx.staged
        if self.compute_stream is not None and out is not None:
            out.record_stream(self.compute_stream)
        return out

    def progress(self, dataloader_iter: Iterator[Any]) -> Optional[Any]:
        """The last stage's output for the oldest batch; ``None`` when the data is exhausted."""
        try:
            if not self.lockstep:
                return super().progress(dataloader_iter)
            held, self._held = self._held, None
            if held is None:  # the first call, or the first after the end of the data or a flush
                held = self._step(dataloader_iter)
            try:  # as TorchRec, the stages of the next batches run before the call returns
                self._held = self._step(dataloader_iter)
            except StopIteration:
                pass
        except StopIteration:
            if self._flushing:
                self.flush_end()
                return self.progress(dataloader_iter)
            return None
        self.steps += 1
        return self._output_of(held)

    def reset(self) -> None:
        """Drop the batches in flight (without running their stages) and forget the iterator."""
        super().reset()
        self._held = None

    def _start(self, dataloader_iter: Iterator[Any]) -> None:
        super()._start(dataloader_iter)
        if self._feed is not None:
            self._feed.on_exhausted = self._data_exhausted

    def _data_exhausted(self) -> None:
        for stage in self.stages:
            if stage.data_exhausted_callback is not None:
                stage.data_exhausted_callback()

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def set_flush(self, flush: bool) -> None:
        """Stop (True) or resume (False) drawing batches; see the module docstring."""
        self._flushing = flush
        if self._feed is not None:
            self._feed.paused = flush

    def flush_end(self) -> None:
        self.set_flush(False)
        if self.on_flush_end is not None:
            self.on_flush_end()


def _uses_sparse_data_dist(stage: Any) -> bool:
    """Whether a stage's runnable or callbacks are methods of a TorchRec ``SparseDataDistUtil``."""
    from torchrec.distributed.train_pipeline.pipeline_stage import SparseDataDistUtil

    functions = (stage.runnable, stage.fill_callback, stage.data_exhausted_callback)
    return any(isinstance(getattr(fn, "__self__", None), SparseDataDistUtil) for fn in functions)


def StagedTrainPipeline(pipeline_stages: Sequence[Any], debug_mode: bool = False, compute_stream: Optional[Any] = None,
                        on_flush_end: Optional[Callable[[], None]] = None, **swp: Any) -> StagedPipeline:
    """TorchRec's StagedTrainPipeline: ``pipeline_stages`` (TorchRec ``PipelineStage`` objects) as a plan.

    A stage's ``stream`` may be an accelerator stream (then all must be on one device)
    or ``None``/a CPU stream: on the CPU each stage runs on a lane named after it.
    The stages run on the calling thread, one step ahead, as TorchRec's
    (``lockstep=True``, the default); ``lockstep=False`` runs them on a worker thread,
    overlapping the caller's step, and refuses stages of a ``SparseDataDistUtil``.
    """
    stages = list(pipeline_stages)
    if not stages:
        raise ValueError("pipeline_stages is empty: StagedTrainPipeline needs at least one PipelineStage")
    accel = [s.stream for s in stages
             if getattr(getattr(s.stream, "device", None), "type", "cpu") in ("cuda", "mtia")]
    device = accel[0].device if accel else torch.device("cpu")
    if accel and len(accel) != len(stages):
        raise ValueError("pipeline_stages: give every stage an accelerator stream, or none of them")
    if compute_stream is None and accel:
        compute_stream = torch.get_device_module(device).current_stream()
    tasks = [PipelineTask(stage.name, _StageTask(k, stage, len(stages), bool(accel))) for k, stage in enumerate(stages)]
    schedule = {task: TaskSchedule(stage=k, stream=stages[k].stream if accel else stages[k].name)
                for k, task in enumerate(tasks)}
    plan = PipelinePlan(schedule=schedule, intra_iter_deps=[(tasks[k], tasks[k - 1]) for k in range(1, len(tasks))])
    return StagedPipeline(plan, device, stages, compute_stream, on_flush_end, **swp)
